"""``python -m jigsaw_verl.main_ppo``: verl's ``main_ppo`` plus the ``jigsaw`` config group and the CPU backend.

Every verl override works unchanged; with ``jigsaw.enable=false`` the run is verl's own
(``verl.trainer.main_ppo.main``). ``trainer.device=cpu`` switches the run onto the CPU backend
(:mod:`jigsaw_verl.cpu.backend`) after checking it, before verl or Ray start.
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

JIGSAW_KEYS = {"enable"}


class JigsawConfigError(ValueError):
    """A ``jigsaw.*`` key is unknown or not supported yet."""


def check_jigsaw_config(config: DictConfig) -> None:
    unknown = sorted(set(config.get("jigsaw", {})) - JIGSAW_KEYS)
    if unknown:
        raise JigsawConfigError(f"unknown key jigsaw.{unknown[0]} (known: {', '.join(sorted(JIGSAW_KEYS))})")
    if config.jigsaw.enable:
        raise JigsawConfigError("jigsaw.enable=true: pipeline multiplexing is not available yet (issue 6)")


def prepare(config: DictConfig) -> None:
    """All checks and adjustments that must happen before verl is imported."""
    check_jigsaw_config(config)
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
