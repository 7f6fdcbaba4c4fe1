"""verl plugin entry point (``verl.plugins`` group in setup.py): verl imports it in every process.

It acts only in processes of a CPU run (``VERL_PLATFORM=cpu``, set by ``jigsaw_verl.main_ppo`` when
``trainer.device=cpu`` and inherited by every Ray worker): there it registers the ``cpu`` platform, the ``cpu``
rollout replica (``actor_rollout_ref.rollout.name=cpu``), verl's FSDP engines for device ``cpu`` and applies the
patches in ``patches/`` (``jigsaw_verl.patches``). Elsewhere (GPU runs) importing it does nothing, so it costs verl
users nothing. verl swallows plugin import errors at debug level, so failures are logged here at error level.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)
_done = False


def _load_replica():
    from jigsaw_verl.integration.cpu.rollout.replica import CPURolloutReplica

    return CPURolloutReplica


def register() -> None:
    """Register the CPU backend with verl (idempotent)."""
    global _done
    if _done:
        return
    # NOTE: the platform first: importing verl's engines asks for the current platform.
    # Patches next: some wrap functions that verl modules import by name.
    from jigsaw_verl.integration.cpu import platform  # noqa: F401  (registers the "cpu" platform)
    from jigsaw_verl.patches import apply_all

    apply_all()
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead, FSDPEngineWithValueHead
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    RolloutReplicaRegistry.register("cpu", _load_replica)
    for model_type, engine in (("language_model", FSDPEngineWithLMHead), ("value_model", FSDPEngineWithValueHead)):
        if "cpu" not in EngineRegistry._engines.get(model_type, {}).get("fsdp2", {}):
            EngineRegistry.register(model_type=model_type, backend=["fsdp", "fsdp2"], device="cpu")(engine)
    _done = True


def register_trainer_modes() -> None:
    """Register verl V1 trainer mode ``jigsaw`` (imports verl's trainer; only in runs that use it)."""
    from jigsaw_verl.integration.trainer import v1_jigsaw  # noqa: F401


# NOTE: the CPU platform first: importing verl's trainer asks for the current platform.
if os.environ.get("VERL_PLATFORM", "").strip().lower() == "cpu":
    try:
        register()
    except Exception:  # verl would hide this
        logger.exception("jigsaw-verl: registering the CPU backend with verl failed")
        raise

if os.environ.get("JIGSAW_VERL_TQ_NAMESPACE"):  # a multiplexed run, on any platform: its own TransferQueue, nearby
    try:
        from jigsaw_verl.patches import reward_loop_node, transfer_queue_namespace, transfer_queue_storage_node

        if not transfer_queue_namespace.is_applied():
            transfer_queue_namespace.apply()
        transfer_queue_storage_node.apply()  # idempotent
        if not reward_loop_node.is_applied():
            reward_loop_node.apply()
    except Exception:  # verl would hide this
        logger.exception("jigsaw-verl: keeping the pipeline's TransferQueue and reward workers to itself failed")
        raise
if os.environ.get("JIGSAW_VERL_TRAINER_MODES") == "1":
    try:
        register_trainer_modes()
    except Exception:  # verl would hide this
        logger.exception("jigsaw-verl: registering trainer mode 'jigsaw' with verl failed")
        raise
