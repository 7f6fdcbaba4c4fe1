"""Place a multiplexed pipeline's reward-loop workers on its trainer's node.

What: ``RewardLoopManager._init_reward_loop_workers`` (``verl/experimental/reward_loop/reward_loop.py``) places
``reward.num_workers`` workers round-robin over every alive Ray node with CPUs (soft node affinity). In a pipeline
of a multiplexing group (``JIGSAW_VERL_TQ_NAMESPACE`` set) this patch places them all on the node of the process
that creates the manager (verl's trainer, the ``TaskRunner``), with the same soft affinity, names and arguments.

Why: a group's Ray nodes are shared. Round-robin puts a pipeline's reward workers on nodes where only other
pipelines' workers live, so a node that dies (ending the pipelines placed there) would take them and end this
pipeline too. verl's V1 trainer builds the manager inline in ``_setup`` (``verl/trainer/ppo/v1/trainer_base.py``),
so there is no class to substitute; the agent-loop workers, which have one
(``actor_rollout_ref.rollout.agent.agent_loop_manager_class``), are placed by
``jigsaw_verl.integration.trainer.agent_loop_placement`` instead.
"""

from __future__ import annotations

import os

VERL_VERSIONS = ("0.9.1",)
ENV = "JIGSAW_VERL_TQ_NAMESPACE"
_MARK = "_jigsaw_on_trainer_node"


def _init_reward_loop_workers(self) -> None:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = ray.get_runtime_context().get_node_id()
    self.reward_loop_workers = [
        self.reward_loop_workers_class.options(
            name=f"reward_loop_worker_{i}",
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=here, soft=True),
        ).remote(self.config, self.reward_router_address)
        for i in range(self.config.reward.num_workers)
    ]


def is_applied() -> bool:
    from verl.experimental.reward_loop.reward_loop import RewardLoopManager

    return getattr(RewardLoopManager._init_reward_loop_workers, _MARK, False)


def apply() -> None:
    if not os.environ.get(ENV):
        raise RuntimeError(f"{ENV} is not set: not a multiplexed run, nothing to apply")
    from jigsaw_verl.patches import installed_verl_version

    found = installed_verl_version()
    if found not in VERL_VERSIONS:
        raise RuntimeError(
            f"jigsaw_verl.patches.reward_loop_node was written for verl {', '.join(VERL_VERSIONS)}; installed is "
            f"{found}. Re-check it against this release before widening VERL_VERSIONS."
        )
    from verl.experimental.reward_loop.reward_loop import RewardLoopManager

    setattr(_init_reward_loop_workers, _MARK, True)
    RewardLoopManager._init_reward_loop_workers = _init_reward_loop_workers
