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

JIGSAW_KEYS = {"enable", "migration"}
MIGRATION_KEYS = {"enable", "tail_threshold", "poll_s"}


class JigsawConfigError(ValueError):
    """A ``jigsaw.*`` key is unknown or not supported yet."""


def check_jigsaw_config(config: DictConfig) -> None:
    unknown = sorted(set(config.get("jigsaw", {})) - JIGSAW_KEYS)
    if unknown:
        raise JigsawConfigError(f"unknown key jigsaw.{unknown[0]} (known: {', '.join(sorted(JIGSAW_KEYS))})")
    unknown = sorted(set(config.jigsaw.get("migration", {})) - MIGRATION_KEYS)
    if unknown:
        raise JigsawConfigError(
            f"unknown key jigsaw.migration.{unknown[0]} (known: {', '.join(sorted(MIGRATION_KEYS))})"
        )
    if config.jigsaw.enable:
        raise JigsawConfigError("jigsaw.enable=true: pipeline multiplexing is not available yet (issue 6)")
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


def enable_migration(config: DictConfig) -> None:
    """Select the ``jigsaw`` trainer mode and the migrating load balancer (both verl extension points)."""
    from pathlib import Path

    from omegaconf import open_dict

    os.environ["JIGSAW_VERL_TRAINER_MODES"] = "1"  # the plugin registers trainer mode `jigsaw` in every process
    with open_dict(config):
        config.trainer.v1.trainer_mode = "jigsaw"
        config.actor_rollout_ref.rollout.router_config_path = str(
            Path(__file__).resolve().parent / "config" / "migrating_router.yaml"
        )
        env = config.ray_kwargs.setdefault("ray_init", {}).setdefault("runtime_env", {}).setdefault("env_vars", {})
        env["JIGSAW_VERL_TRAINER_MODES"] = "1"


def prepare(config: DictConfig) -> None:
    """All checks and adjustments that must happen before verl is imported."""
    check_jigsaw_config(config)
    if config.jigsaw.get("migration", {}).get("enable", False):
        enable_migration(config)
    if config.trainer.get("device") == "cpu":
        from .cpu.backend import prepare_cpu_run

        changed = prepare_cpu_run(config)
        print(f"jigsaw_verl.main_ppo: CPU backend; set for the CPU: {', '.join(changed) or 'nothing'}", flush=True)


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


if __name__ == "__main__":
    main()
