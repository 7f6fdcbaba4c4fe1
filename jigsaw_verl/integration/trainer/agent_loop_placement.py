"""Agent-loop workers of a multiplexed pipeline beside its trainer, not spread over the group's nodes.

verl's ``AgentLoopManager._init_agent_loop_workers`` (``verl/experimental/agent_loop/agent_loop.py``) places its
``rollout.agent.num_workers`` workers round-robin over every alive Ray node with CPUs. In a group the nodes are
shared: a pipeline's workers would land on nodes where only other pipelines live, and a node that dies (ending
the pipelines placed there) would take them and end this pipeline too. :class:`NodeLocalAgentLoopManager` is
verl's V1 manager (``AgentLoopManagerTQ``, ``verl/trainer/ppo/v1/agent_loop_tq.py``) with the workers placed on the
node of the process that creates it (verl's ``TaskRunner``, which also holds the pipeline's TransferQueue storage:
``patches/transfer_queue_storage_node.py``). The entry point selects it through verl's extension point
``actor_rollout_ref.rollout.agent.agent_loop_manager_class`` for a pipeline of a group that names no manager of its
own.
"""

from __future__ import annotations

from uuid import uuid4

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
from verl.trainer.ppo.v1 import AgentLoopManagerTQ


class NodeLocalAgentLoopManager(AgentLoopManagerTQ):
    """verl's V1 agent-loop manager whose workers run on the creating process's node (soft affinity, as verl's
    own placement: a node without room still takes them elsewhere)."""

    async def _init_agent_loop_workers(self):
        here = ray.get_runtime_context().get_node_id()
        self.agent_loop_workers = [
            self.agent_loop_workers_class.options(
                name=f"agent_loop_worker_{i}_{uuid4().hex[:8]}",
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=here, soft=True),
            ).remote(self.config, self.llm_client, self.teacher_client, self.reward_loop_worker_handles)
            for i in range(self.rollout_config.agent.num_workers)
        ]
