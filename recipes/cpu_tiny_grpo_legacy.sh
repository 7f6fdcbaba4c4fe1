#!/usr/bin/env bash
# The import-swap way in: a recipe that builds verl's legacy RayPPOTrainer itself (recipes/legacy_dropin/: verl's
# main_ppo_v0.py with `from jigsaw_verl.trainer import RayPPOTrainer` as its one change, produced from the installed
# verl at start), run on the CPU with the
# settings of cpu_tiny_grpo.sh: 3 GRPO steps, rollout.n=4. Logs jigsaw/stage_s/<stage> every step.
# Extra arguments are appended as hydra overrides, e.g. `trainer.total_training_steps=2`.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/cpu_tiny_grpo_legacy} ENTRY=recipes/legacy_dropin/main.py exec bash recipes/cpu_tiny_grpo.sh \
    trainer.experiment_name=tiny_grpo_legacy \
    trainer.use_v1=false \
    "$@"
