"""``python -m jigsaw_verl.main_ppo``: verl's ``main_ppo`` plus the ``jigsaw`` config group and the CPU backend.

Every verl override works unchanged; with ``jigsaw.enable=false`` the run is verl's own
(``verl.trainer.main_ppo.main``). ``trainer.device=cpu`` switches the run onto the CPU backend
(:mod:`jigsaw_verl.cpu.backend`) after checking it, before verl or Ray start.
"""

from __future__ import annotations

import os
import sys

import hydra
from omegaconf import DictConfig

JIGSAW_KEYS = {"enable", "migration", "mux"}
MIGRATION_KEYS = {"enable", "tail_threshold", "poll_s"}
MUX_KEYS = {"group", "pipeline", "slots", "pool_slots", "policy", "gpu"}
# the group's pool size, given to each pipeline by the launcher so a pipeline too big for it fails before it starts
POOL_ENV = "JIGSAW_VERL_MUX_POOL_SLOTS"
# environment the launcher gives a pipeline that its Ray actors need too
FORWARDED_ENV = ("VERL_FILE_LOGGER_PATH",)


class JigsawConfigError(ValueError):
    """A ``jigsaw.*`` key is unknown or not supported yet."""


def check_jigsaw_overrides(argv: list[str]) -> None:
    """Reject an unknown ``jigsaw.*`` command-line key before hydra does (hydra's own error is a six-line
    traceback); the config checks below repeat this for keys that come from elsewhere."""
    groups = {"": JIGSAW_KEYS, "migration": MIGRATION_KEYS, "mux": MUX_KEYS}
    for arg in argv:
        key = arg.split("=", 1)[0].lstrip("+~")
        if "=" not in arg or not key.startswith("jigsaw."):
            continue
        parts = key.split(".")[1:]
        if parts[0] not in JIGSAW_KEYS:
            raise JigsawConfigError(f"unknown key jigsaw.{parts[0]} (known: {', '.join(sorted(JIGSAW_KEYS))})")
        if len(parts) > 1 and parts[0] in groups and parts[1] not in groups[parts[0]]:
            known = ", ".join(sorted(groups[parts[0]]))
            raise JigsawConfigError(f"unknown key jigsaw.{parts[0]}.{parts[1]} (known: {known})")


def check_jigsaw_config(config: DictConfig) -> None:
    unknown = sorted(set(config.get("jigsaw", {})) - JIGSAW_KEYS)
    if unknown:
        raise JigsawConfigError(f"unknown key jigsaw.{unknown[0]} (known: {', '.join(sorted(JIGSAW_KEYS))})")
    unknown = sorted(set(config.jigsaw.get("migration", {})) - MIGRATION_KEYS)
    if unknown:
        raise JigsawConfigError(
            f"unknown key jigsaw.migration.{unknown[0]} (known: {', '.join(sorted(MIGRATION_KEYS))})"
        )
    unknown = sorted(set(config.jigsaw.get("mux", {})) - MUX_KEYS)
    if unknown:
        raise JigsawConfigError(f"unknown key jigsaw.mux.{unknown[0]} (known: {', '.join(sorted(MUX_KEYS))})")
    if config.jigsaw.enable:
        mux = config.jigsaw.get("mux", {})
        if not mux.get("group"):
            raise JigsawConfigError("jigsaw.enable=true needs jigsaw.mux.group: the multiplexing group to join")
        if config.trainer.get("total_training_steps") is None:
            raise JigsawConfigError("jigsaw.enable=true needs trainer.total_training_steps (the scheduler plans steps)")
        from .sim.policies import POLICIES

        if mux.get("policy", "jigsaw") not in POLICIES:
            raise JigsawConfigError(
                f"jigsaw.mux.policy={mux.policy!r} is unknown (known: {', '.join(sorted(POLICIES.names()))})"
            )
        slots = int(mux.get("slots") or config.trainer.n_gpus_per_node * config.trainer.nnodes)
        pool = os.environ.get(POOL_ENV) or mux.get("pool_slots")
        if pool is not None and slots > int(pool):
            name = mux.get("pipeline") or config.trainer.experiment_name
            raise JigsawConfigError(
                f"jigsaw.mux.slots: pipeline {name!r} needs {slots} slots (trainer.n_gpus_per_node x trainer.nnodes "
                f"unless set) but group {mux.group!r} has a pool of {int(pool)}"
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

    os.environ["JIGSAW_VERL_TRAINER_MODES"] = "1"  # the plugin registers trainer mode `jigsaw` in every process
    with open_dict(config):
        config.trainer.v1.trainer_mode = "jigsaw"
        config.actor_rollout_ref.rollout.router_config_path = str(
            Path(__file__).resolve().parent / "config" / "migrating_router.yaml"
        )
    set_ray_env(config, "JIGSAW_VERL_TRAINER_MODES", "1")


def set_ray_env(config: DictConfig, name: str, value: str) -> None:
    """Give every Ray worker of the run environment variable ``name`` (through the job's runtime env, which also
    reaches workers of a cluster the run joins rather than starts)."""
    from omegaconf import OmegaConf

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
        # pipelines of a group share a Ray cluster; each keeps its own TransferQueue (patches/transfer_queue_namespace)
        pipeline = config.jigsaw.mux.get("pipeline") or config.trainer.experiment_name
        namespace = f"transfer_queue.{config.jigsaw.mux.group}.{pipeline}"
        os.environ["JIGSAW_VERL_TQ_NAMESPACE"] = namespace
        set_ray_env(config, "JIGSAW_VERL_TQ_NAMESPACE", namespace)
    if config.trainer.get("device") == "cpu":
        from .cpu.backend import prepare_cpu_run

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
    from .cpu.backend import CPUConfigError

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
