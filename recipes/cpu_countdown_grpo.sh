#!/usr/bin/env bash
# The tail-heavy tiny task: the bundled CPU GRPO recipe on the countdown assets ("Count down from N." with N drawn
# log-normal: most responses a few tokens, the longest of a step's 16 prompts often a hundred or more; see
# jigsaw_verl/integration/cpu/tiny_tasks.py). A rollout has a visible long tail on the CPU, as long-CoT RL has on
# GPUs. Extra arguments are appended as hydra overrides, after these.
set -euo pipefail
cd "$(dirname "$0")/.."
TASK=countdown OUT=${OUT:-out/cpu_countdown_grpo} exec bash recipes/cpu_tiny_grpo.sh \
    data.train_batch_size=16 \
    data.max_prompt_length=32 \
    data.max_response_length=160 \
    actor_rollout_ref.actor.ppo_mini_batch_size=16 \
    trainer.experiment_name=countdown_grpo \
    "$@"
