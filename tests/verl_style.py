"""The verl-style recipe the tests run (``fixtures/verl_style_grpo.sh``: written the way verl's example scripts are)
and the overrides that shrink it to the bundled CPU recipe's settings."""

from __future__ import annotations

from pathlib import Path

from jigsaw_verl.integration.cpu.assets import build_tiny_assets

ROOT = Path(__file__).resolve().parent.parent
VERL_STYLE = ROOT / "tests" / "fixtures" / "verl_style_grpo.sh"


def cpu_size_overrides() -> list[str]:
    """What shrinks the verl-style GSM8K script to the bundled CPU recipe's settings (its step count aside: the
    script keeps ``trainer.total_epochs``, one epoch of 24 rows)."""
    assets = build_tiny_assets().root
    return [
        f"data.train_files={assets}/train.parquet", f"data.val_files={assets}/val.parquet",
        "data.train_batch_size=8", "data.max_prompt_length=64", "data.max_response_length=24",
        "data.shuffle=False", "data.seed=1", "data.dataloader_num_workers=0", "data.train_max_samples=24",
        f"actor_rollout_ref.model.path={assets}/model", "actor_rollout_ref.model.use_remove_padding=False",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False", "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.rollout.name=cpu", "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.rollout.full_determinism=True", "actor_rollout_ref.rollout.agent.num_workers=1",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.ref.fsdp_config.param_offload=False",
        f"reward.custom_reward_function.path={ROOT}/jigsaw_verl/integration/cpu/reward.py",
        "reward.custom_reward_function.name=compute_score",
        "trainer.device=cpu", "trainer.n_gpus_per_node=2", "trainer.critic_warmup=0", "trainer.logger=[console,file]",
        "trainer.val_before_train=False", "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.total_epochs=1",
    ]  # fmt: skip
