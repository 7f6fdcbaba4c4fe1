"""Entry point of the legacy drop-in recipe: verl's ``main_ppo.main`` with the recipe's own ``TaskRunner``.

The recipe's ``TaskRunner`` is verl's own ``verl/trainer/main_ppo_v0.py`` (0.9.1) with one line changed,
``from jigsaw_verl.trainer import RayPPOTrainer``, as a recipe modelled on it would carry it; the repository keeps no
copy of verl's file: :func:`~jigsaw_verl.integration.trainer.import_swap.load_swapped` produces that module from the
installed verl when the recipe starts. This file is what such a recipe's
``main`` does (verl's ``main_ppo.main``: ``auto_set_device``, ``validate_config``, ``run_ppo(config, TaskRunner)``),
reading verl's config plus the ``jigsaw`` group and preparing the run the way ``python -m jigsaw_verl.main_ppo``
does (``trainer.device=cpu`` switches to the CPU backend before Ray starts).

    python recipes/legacy_dropin/main.py <verl overrides>      # see recipes/cpu_tiny_grpo_legacy.sh
"""

import sys

import hydra

from jigsaw_verl.integration.settings import CONFIG_FILE

CONFIG_DIR = str(CONFIG_FILE.parent)  # the config python -m jigsaw_verl.main_ppo composes


@hydra.main(config_path=CONFIG_DIR, config_name="jigsaw_ppo_trainer", version_base=None)
def main(config):
    from jigsaw_verl.integration.cpu.backend import CPUConfigError
    from jigsaw_verl.integration.main_ppo import JigsawConfigError, prepare

    try:
        prepare(config)  # before verl is imported (selects the CPU platform)
        from jigsaw_verl.integration.trainer.legacy import LegacyMigrationError, check_legacy_config

        check_legacy_config(config)
    except (JigsawConfigError, CPUConfigError, LegacyMigrationError) as err:
        print(f"legacy_dropin: error: {err}", file=sys.stderr)
        sys.exit(2)

    from jigsaw_verl.integration.trainer.import_swap import load_swapped

    TaskRunner = load_swapped().TaskRunner  # verl's main_ppo_v0 with the import swapped, produced now
    from verl.trainer.main_ppo import run_ppo
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    auto_set_device(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    run_ppo(config, task_runner_class=TaskRunner)


if __name__ == "__main__":
    main()
