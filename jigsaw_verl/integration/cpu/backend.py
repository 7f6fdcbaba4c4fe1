"""Switching a verl run onto the CPU backend (``trainer.device=cpu``), with its checks.

:func:`prepare_cpu_run` is called by ``jigsaw_verl.main_ppo`` after hydra composed the config and before verl
or Ray start. It checks what a CPU run needs (one clear error per problem), selects the ``cpu`` platform for the
driver and every Ray worker, and sizes what verl sizes for a GPU node for a small machine instead.
"""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from jigsaw_verl.integration.cpu.slot_cores import PIN_CORES_ENV

CPU_ROLLOUTS = ("cpu",)
# Logical CPU slots Ray advertises: verl's actors each ask for some (TransferQueue's controller and storage,
# the task runner, the agent-loop workers); over-subscribing a small machine is fine, deadlocking is not.
RAY_LOGICAL_CPUS = 16


class CPUConfigError(ValueError):
    """A ``trainer.device=cpu`` run is configured in a way the CPU backend cannot serve."""


def check_cpu_config(config: DictConfig) -> None:
    """Raise :class:`CPUConfigError` naming the keys at fault; nothing is started."""
    rollout = config.actor_rollout_ref.rollout.get("name")
    if rollout not in CPU_ROLLOUTS:
        raise CPUConfigError(
            f"trainer.device=cpu needs actor_rollout_ref.rollout.name in {list(CPU_ROLLOUTS)}, got {rollout!r} "
            "(vLLM/SGLang/TRT-LLM need a GPU; the CPU rollout serves the same interface)"
        )
    path = config.actor_rollout_ref.model.get("path")
    if not path or not Path(os.path.expanduser(str(path))).is_dir():
        raise CPUConfigError(
            f"actor_rollout_ref.model.path={path!r} is not a local model folder (CPU runs load models from disk; "
            "`python -m jigsaw_verl.integration.cpu.assets` builds a tiny one)"
        )
    for key in ("actor_rollout_ref.actor.strategy", "actor_rollout_ref.ref.strategy", "critic.strategy"):
        value = OmegaConf.select(config, key, default=None)
        if value not in (None, "fsdp", "fsdp2"):
            raise CPUConfigError(f"trainer.device=cpu supports FSDP2 training only; {key}={value!r}")


def prepare_cpu_run(config: DictConfig) -> list[str]:
    """Check ``config`` and adapt it and the environment for a CPU run (before verl is imported).

    Returns:
        One line per setting changed from verl's GPU defaults, for the log.
    """
    check_cpu_config(config)
    os.environ["VERL_PLATFORM"] = "cpu"  # inherited by the local Ray cluster's workers
    # hydra's config search path may already have imported verl (and its plugins) in this process.
    from jigsaw_verl.integration.cpu.plugin import register

    register()
    changed = []
    with open_dict(config):
        for key in ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic"):
            node = OmegaConf.select(config, key)
            if node is not None and node.get("strategy") == "fsdp":  # FSDP1 needs an accelerator
                node.strategy = "fsdp2"
                changed.append(f"{key}.strategy=fsdp2")
        model = config.actor_rollout_ref.model
        override = model.get("override_config") or {}
        if "attn_implementation" not in override:
            model.override_config = {**override, "attn_implementation": "sdpa"}  # no flash-attn on the CPU
            changed.append("actor_rollout_ref.model.override_config.attn_implementation=sdpa")
        storage = config.transfer_queue.backend.get("SimpleStorage")
        if storage is not None and storage.get("num_data_storage_units", 1) > 2:
            storage.num_data_storage_units = 1
            changed.append("transfer_queue.backend.SimpleStorage.num_data_storage_units=1")
        ray_init = config.ray_kwargs.setdefault("ray_init", {})
        if ray_init.get("num_cpus") is None:
            ray_init.num_cpus = RAY_LOGICAL_CPUS
            changed.append(f"ray_kwargs.ray_init.num_cpus={RAY_LOGICAL_CPUS}")
        env = ray_init.setdefault("runtime_env", {}).setdefault("env_vars", {})
        env["VERL_PLATFORM"] = "cpu"
        if OmegaConf.select(config, "jigsaw.mux.pin_cores", default=False):  # every worker of the job pins itself
            env[PIN_CORES_ENV] = "1"
    return changed
