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

JIGSAW_KEYS = {"enable", "migration", "mux"}
MIGRATION_KEYS = {"enable", "tail_threshold", "poll_s"}
MUX_KEYS = {"group", "pipeline", "slots", "pool_slots", "policy", "gpu", "max_pipelines", "offload"}
# the known keys of each level of the jigsaw group
KNOWN_KEYS = {"jigsaw": JIGSAW_KEYS, "jigsaw.migration": MIGRATION_KEYS, "jigsaw.mux": MUX_KEYS}
# environment the launcher gives a pipeline that its Ray actors need too
FORWARDED_ENV = ("VERL_FILE_LOGGER_PATH",)


class JigsawConfigError(ValueError):
    """A ``jigsaw.*`` key is unknown or not supported yet."""


def _refuse_unknown(level: str, key: str) -> None:
    known = KNOWN_KEYS[level]
    if key not in known:
        raise JigsawConfigError(f"unknown key {level}.{key} (known: {', '.join(sorted(known))})")


def check_jigsaw_overrides(argv: list[str]) -> None:
    """Reject an unknown ``jigsaw.*`` command-line key before hydra does (hydra's own error is a six-line
    traceback); the config checks below repeat this for keys that come from elsewhere."""
    for arg in argv:
        key = arg.split("=", 1)[0].lstrip("+~")
        if "=" not in arg or not key.startswith("jigsaw."):
            continue
        parts = key.split(".")[1:]
        _refuse_unknown("jigsaw", parts[0])
        if len(parts) > 1 and f"jigsaw.{parts[0]}" in KNOWN_KEYS:
            _refuse_unknown(f"jigsaw.{parts[0]}", parts[1])


def check_jigsaw_config(config: DictConfig) -> None:
    for key in sorted(config.get("jigsaw", {})):
        _refuse_unknown("jigsaw", key)
    for level in ("migration", "mux"):
        for key in sorted(config.jigsaw.get(level, {})):
            _refuse_unknown(f"jigsaw.{level}", key)
    if config.jigsaw.enable:
        mux = config.jigsaw.get("mux", {})
        if not mux.get("group"):
            raise JigsawConfigError("jigsaw.enable=true needs jigsaw.mux.group: the multiplexing group to join")
        if config.trainer.get("total_training_steps") is None:
            raise JigsawConfigError("jigsaw.enable=true needs trainer.total_training_steps (the scheduler plans steps)")
        from jigsaw_verl.policy.catalog import POLICIES

        if mux.get("policy", "jigsaw") not in POLICIES:
            raise JigsawConfigError(
                f"jigsaw.mux.policy={mux.policy!r} is unknown (known: {', '.join(sorted(POLICIES.names()))})"
            )
        from jigsaw_verl.integration.pipeline_spec import mux_pipeline_name, mux_slots

        slots, pool = mux_slots(config), mux.get("pool_slots")
        if pool is not None and slots > int(pool):
            raise JigsawConfigError(
                f"jigsaw.mux.slots: pipeline {mux_pipeline_name(config)!r} needs {slots} slots "
                f"(trainer.n_gpus_per_node x trainer.nnodes unless set) but group {mux.group!r} has a pool of "
                f"{int(pool)}"
            )
        if mux.get("max_pipelines") is not None and int(mux.max_pipelines) < 1:
            raise JigsawConfigError(f"jigsaw.mux.max_pipelines={mux.max_pipelines}: a group holds at least 1 pipeline")
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
        if pool is not None and int(config.trainer.n_gpus_per_node) > int(pool):
            raise JigsawConfigError(
                f"trainer.n_gpus_per_node={config.trainer.n_gpus_per_node}: pipeline {mux_pipeline_name(config)!r} "
                f"places more workers than group {mux.group!r} has pool slots ({int(pool)})"
            )
        mode = config.trainer.v1.get("trainer_mode", "sync")
        if mode not in ("sync", "jigsaw") or not config.trainer.get("use_v1", True):
            raise JigsawConfigError(
                f"jigsaw.enable=true runs verl's V1 trainer in mode jigsaw; trainer.v1.trainer_mode={mode!r} "
                f"/ trainer.use_v1={config.trainer.get('use_v1')} is not supported with it"
            )
    migration = config.jigsaw.get("migration", {})
    if migration.get("enable", False):
        if int(migration.get("tail_threshold", 4)) < 1:
            raise JigsawConfigError(f"jigsaw.migration.tail_threshold must be >= 1, got {migration.tail_threshold}")
        mode = config.trainer.v1.get("trainer_mode", "sync")
        if mode not in ("sync", "jigsaw"):
            raise JigsawConfigError(
                f"jigsaw.migration.enable=true runs trainer.v1.trainer_mode=jigsaw (sync + migration); "
                f"trainer.v1.trainer_mode={mode!r} is not supported with it"
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


def prepare(config: DictConfig) -> None:
    """All checks and adjustments that must happen before verl is imported."""
    check_jigsaw_config(config)
    if (
        config.jigsaw.enable
        or config.jigsaw.get("migration", {}).get("enable", False)
        or config.trainer.v1.get("trainer_mode") == "jigsaw"
    ):
        select_jigsaw_trainer(config)
    if config.jigsaw.enable:
        # pipelines of a group share a Ray cluster; each keeps its own TransferQueue
        # (patches/transfer_queue_namespace.py)
        from jigsaw_verl.integration.pipeline_spec import mux_pipeline_name

        set_ray_env(
            config, "JIGSAW_VERL_TQ_NAMESPACE", f"transfer_queue.{config.jigsaw.mux.group}.{mux_pipeline_name(config)}"
        )
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


@hydra.main(config_path="config", config_name="jigsaw_ppo_trainer", version_base=None)
def main(config: DictConfig) -> None:
    from jigsaw_verl.integration.cpu.backend import CPUConfigError

    try:
        prepare(config)
    except (JigsawConfigError, CPUConfigError) as err:
        print(f"jigsaw_verl.main_ppo: error: {err}", file=sys.stderr)
        sys.exit(2)
    from verl.trainer.main_ppo import main as verl_main

    verl_main(config)  # hydra's decorator passes a given config straight through


def cli() -> None:
    """``python -m jigsaw_verl.main_ppo``: the override check, then hydra."""
    try:
        check_jigsaw_overrides(sys.argv[1:])
    except JigsawConfigError as err:
        print(f"jigsaw_verl.main_ppo: error: {err}", file=sys.stderr)
        sys.exit(2)
    main()


if __name__ == "__main__":
    cli()
