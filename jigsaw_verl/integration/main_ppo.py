"""``python -m jigsaw_verl.main_ppo``: verl's ``main_ppo`` plus the ``jigsaw`` config group and the CPU backend.

Every verl override works unchanged; with ``jigsaw.enable=false`` the run is verl's own
(``verl.trainer.main_ppo.main``). ``trainer.device=cpu`` switches the run onto the CPU backend
(:mod:`jigsaw_verl.integration.cpu.backend`) after checking it, before verl or Ray start.
"""

from __future__ import annotations

import os
import sys

import hydra
from omegaconf import DictConfig

from jigsaw_verl.integration.pipeline_spec import mux_pipeline_name, mux_slots
from jigsaw_verl.integration.settings import (
    KNOWN_KEYS,
    JigsawConfigError,
    JigsawSettings,
    MuxSettings,
    refuse_unknown,
)

# JigsawConfigError is imported from here by recipes (recipes/legacy_dropin/main.py)
__all__ = ["JigsawConfigError", "check_jigsaw_config", "check_jigsaw_overrides", "check_mux_policy", "main", "prepare"]
# environment the launcher gives a pipeline that its Ray actors need too
FORWARDED_ENV = ("VERL_FILE_LOGGER_PATH",)


def check_jigsaw_overrides(argv: list[str]) -> None:
    """Reject an unknown ``jigsaw.*`` command-line key before hydra does (hydra's own error is a six-line
    traceback); :meth:`JigsawSettings.from_config` repeats this for keys that come from elsewhere."""
    for arg in argv:
        key = arg.split("=", 1)[0].lstrip("+~")
        if "=" not in arg or not key.startswith("jigsaw."):
            continue
        parts = key.split(".")[1:]
        refuse_unknown("jigsaw", parts[0])
        if len(parts) > 1 and f"jigsaw.{parts[0]}" in KNOWN_KEYS:
            refuse_unknown(f"jigsaw.{parts[0]}", parts[1])


def check_jigsaw_config(config: DictConfig) -> JigsawSettings:
    """Parse the ``jigsaw`` group of ``config`` and check it against the rest of the verl config, before Ray.

    Returns:
        The run's :class:`JigsawSettings`.

    Raises:
        JigsawConfigError: one line naming the key at fault.
    """
    settings = JigsawSettings.from_config(config)
    if settings.enable:
        _check_mux(settings.mux, config)
    if settings.migration.enable:
        mode = config.trainer.v1.get("trainer_mode", "sync")
        if mode not in ("sync", "jigsaw"):
            raise JigsawConfigError(
                f"jigsaw.migration.enable=true runs trainer.v1.trainer_mode=jigsaw (sync + migration); "
                f"trainer.v1.trainer_mode={mode!r} is not supported with it"
            )
    return settings


def check_mux_policy(policy: str) -> None:
    """Refuse a ``jigsaw.mux.policy`` the registry does not know, or one the live runtime cannot run: a policy that
    needs asynchronous execution (staleness, overlapping stages, interruptible rollouts) beyond the runtime's
    :data:`~jigsaw_verl.runtime.live_policy.LIVE_FEATURES` (none yet)."""
    from jigsaw_verl.policy.registry import POLICIES
    from jigsaw_verl.runtime.live_policy import LIVE_FEATURES, live_policy_names

    try:
        record = POLICIES.get(policy)
    except KeyError:
        known = ", ".join(sorted(POLICIES.names()))
        raise JigsawConfigError(f"jigsaw.mux.policy={policy!r} is unknown (known: {known})") from None
    needs = record.needs - LIVE_FEATURES
    if needs:
        raise JigsawConfigError(
            f"jigsaw.mux.policy={policy!r} needs asynchronous execution ({', '.join(sorted(needs))}), which the live "
            f"runtime does not run yet; it can run: {', '.join(live_policy_names())}"
        )


def _check_mux(mux: MuxSettings, config: DictConfig) -> None:
    """The checks of a multiplexed run (``jigsaw.enable=true``) against verl's own keys."""
    if not mux.group:
        raise JigsawConfigError("jigsaw.enable=true needs jigsaw.mux.group: the multiplexing group to join")
    if config.trainer.get("total_training_steps") is None:
        raise JigsawConfigError("jigsaw.enable=true needs trainer.total_training_steps (the scheduler plans steps)")
    check_mux_policy(mux.policy)
    slots, pool, name = mux_slots(mux, config), mux.pool_slots, mux_pipeline_name(mux, config)
    if pool is not None and slots > pool:
        raise JigsawConfigError(
            f"jigsaw.mux.slots: pipeline {name!r} needs {slots} slots (trainer.n_gpus_per_node x trainer.nnodes "
            f"unless set) but group {mux.group!r} has a pool of {pool}"
        )
    # the pipeline's workers go into the group's one-node pool (mux.shared_pool); say so before Ray starts
    if int(config.trainer.nnodes) != 1:
        raise JigsawConfigError(
            f"trainer.nnodes={config.trainer.nnodes}: a multiplexing group's pool is one node (jigsaw.enable=true)"
        )
    if config.reward.get("reward_model", {}).get("enable_resource_pool", False):
        raise JigsawConfigError(
            "reward.reward_model.enable_resource_pool=true: a multiplexed pipeline runs all its roles in the "
            "group's pool (jigsaw.enable=true)"
        )
    if pool is not None and int(config.trainer.n_gpus_per_node) > pool:
        raise JigsawConfigError(
            f"trainer.n_gpus_per_node={config.trainer.n_gpus_per_node}: pipeline {name!r} "
            f"places more workers than group {mux.group!r} has pool slots ({pool})"
        )
    mode = config.trainer.v1.get("trainer_mode", "sync")
    if mode not in ("sync", "jigsaw") or not config.trainer.get("use_v1", True):
        raise JigsawConfigError(
            f"jigsaw.enable=true runs verl's V1 trainer in mode jigsaw; trainer.v1.trainer_mode={mode!r} "
            f"/ trainer.use_v1={config.trainer.get('use_v1')} is not supported with it"
        )


def select_jigsaw_trainer(config: DictConfig) -> None:
    """Select the ``jigsaw`` trainer mode and the migrating load balancer (both verl extension points)."""
    from pathlib import Path

    from omegaconf import open_dict

    with open_dict(config):
        config.trainer.v1.trainer_mode = "jigsaw"
        config.actor_rollout_ref.rollout.router_config_path = str(
            Path(__file__).resolve().parent / "config" / "migrating_router.yaml"
        )
    set_ray_env(config, "JIGSAW_VERL_TRAINER_MODES", "1")  # the plugin registers trainer mode `jigsaw` everywhere


def set_ray_env(config: DictConfig, name: str, value: str) -> None:
    """Give this process and every Ray worker of the run environment variable ``name`` (through the job's runtime
    env, which also reaches workers of a cluster the run joins rather than starts)."""
    from omegaconf import OmegaConf

    os.environ[name] = value
    OmegaConf.update(config, f"ray_kwargs.ray_init.runtime_env.env_vars.{name}", value, force_add=True)


def prepare(config: DictConfig) -> JigsawSettings:
    """All checks and adjustments that must happen before verl is imported.

    Returns:
        The run's :class:`JigsawSettings` (parsed once, here).
    """
    settings = check_jigsaw_config(config)
    if settings.enable or settings.migration.enable or config.trainer.v1.get("trainer_mode") == "jigsaw":
        select_jigsaw_trainer(config)
    if settings.enable:
        # pipelines of a group share a Ray cluster; each keeps its own TransferQueue
        # (patches/transfer_queue_namespace.py)
        namespace = f"transfer_queue.{settings.mux.group}.{mux_pipeline_name(settings.mux, config)}"
        set_ray_env(config, "JIGSAW_VERL_TQ_NAMESPACE", namespace)
    if config.trainer.get("device") == "cpu":
        from jigsaw_verl.integration.cpu.backend import prepare_cpu_run

        changed = prepare_cpu_run(config)
        print(f"jigsaw_verl.main_ppo: CPU backend; set for the CPU: {', '.join(changed) or 'nothing'}", flush=True)
    if os.environ.get("RAY_ADDRESS"):
        from omegaconf import open_dict

        # joining a running cluster (the mux launcher's): Ray refuses resource sizes from a connecting driver
        with open_dict(config):
            config.ray_kwargs.get("ray_init", {}).pop("num_cpus", None)
    for name in FORWARDED_ENV:
        if name in os.environ:
            set_ray_env(config, name, os.environ[name])
    return settings


@hydra.main(config_path="config", config_name="jigsaw_ppo_trainer", version_base=None)
def hydra_main(config: DictConfig) -> None:
    """hydra's entry: :func:`prepare` (bad input: one line on stderr, exit code 2), then verl's ``main_ppo``."""
    from jigsaw_verl.integration.cpu.backend import CPUConfigError

    try:
        prepare(config)
    except (JigsawConfigError, CPUConfigError) as err:
        print(f"jigsaw_verl.main_ppo: error: {err}", file=sys.stderr)
        sys.exit(2)
    from verl.trainer.main_ppo import main as verl_main

    verl_main(config)  # hydra's decorator passes a given config straight through


def main() -> None:
    """``python -m jigsaw_verl.main_ppo``: the command-line override check, then hydra (:func:`hydra_main`)."""
    try:
        check_jigsaw_overrides(sys.argv[1:])
    except JigsawConfigError as err:
        print(f"jigsaw_verl.main_ppo: error: {err}", file=sys.stderr)
        sys.exit(2)
    hydra_main()


if __name__ == "__main__":
    main()
