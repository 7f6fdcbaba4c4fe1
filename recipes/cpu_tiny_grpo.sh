#!/usr/bin/env bash
# verl's GSM8K GRPO recipe, scaled down to a tiny model on the CPU: 3 GRPO steps, rollout.n=4.
# Runs verl's own trainer (jigsaw.enable=false) through jigsaw_verl.main_ppo with trainer.device=cpu.
# Extra arguments are appended as hydra overrides, e.g. `trainer.total_training_steps=2`.
# gpu_memory_utilization=0.4: two pipelines' rollout engines share each slot in a multiplexing group (its memory rule).
# ENTRY is the python entry point (default: -m jigsaw_verl.main_ppo; cpu_tiny_grpo_legacy.sh swaps it).
# TASK is the tiny task whose assets it trains on (default arith; cpu_countdown_grpo.sh sets countdown).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
ASSETS=$($PY -c "from jigsaw_verl.integration.cpu.assets import build_tiny_assets as b; print(b(task='${TASK:-arith}').root)" 2>/dev/null | tail -n 1)
OUT=${OUT:-out/cpu_tiny_grpo}
mkdir -p "$OUT"

ENTRY=${ENTRY:--m jigsaw_verl.main_ppo}

# shellcheck disable=SC2086  # ENTRY is two words on purpose
exec $PY $ENTRY \
    algorithm.adv_estimator=grpo \
    data.train_files="$ASSETS/train.parquet" \
    data.val_files="$ASSETS/val.parquet" \
    data.train_batch_size=8 \
    data.max_prompt_length=64 \
    data.max_response_length=24 \
    data.filter_overlong_prompts=True \
    data.truncation=error \
    data.shuffle=False \
    data.seed=1 \
    data.dataloader_num_workers=0 \
    actor_rollout_ref.model.path="$ASSETS/model" \
    actor_rollout_ref.model.use_remove_padding=False \
    actor_rollout_ref.model.enable_gradient_checkpointing=False \
    actor_rollout_ref.actor.optim.lr=1e-3 \
    actor_rollout_ref.actor.ppo_mini_batch_size=8 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.actor.fsdp_config.param_offload=False \
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False \
    actor_rollout_ref.rollout.name=cpu \
    actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.4 \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.rollout.full_determinism=True \
    actor_rollout_ref.rollout.seed=7 \
    actor_rollout_ref.rollout.agent.num_workers=1 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.ref.fsdp_config.param_offload=False \
    reward.custom_reward_function.path="$PWD/jigsaw_verl/integration/cpu/reward.py" \
    reward.custom_reward_function.name=compute_score \
    algorithm.use_kl_in_reward=False \
    trainer.device=cpu \
    trainer.n_gpus_per_node=2 \
    trainer.nnodes=1 \
    trainer.critic_warmup=0 \
    trainer.logger=console \
    trainer.project_name=jigsaw_cpu \
    trainer.experiment_name=tiny_grpo \
    trainer.val_before_train=False \
    trainer.test_freq=-1 \
    trainer.save_freq=-1 \
    trainer.default_local_dir="$OUT/checkpoints" \
    trainer.total_training_steps=3 \
    trainer.total_epochs=1 \
    jigsaw.enable=false \
    "$@"
