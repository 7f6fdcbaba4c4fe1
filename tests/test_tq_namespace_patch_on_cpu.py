"""patches/transfer_queue_namespace.py: each multiplexed run gets its own TransferQueue actors in a shared Ray
cluster (tested on real Ray actors and on TransferQueue's real module objects, which the test restores)."""

from __future__ import annotations

import pytest


def test_named_actors_go_to_the_run_namespace(ray_session, monkeypatch):
    import transfer_queue.interface as tqi
    from transfer_queue.storage.clients import ray_storage_client

    from jigsaw_verl.patches import transfer_queue_namespace as patch

    saved = (tqi.ray, tqi.TransferQueueController, ray_storage_client.ray, ray_storage_client.RayObjectRefStorage)
    monkeypatch.setenv(patch.ENV, "transfer_queue.g.p0")
    try:
        assert not patch.is_applied()
        patch.apply()
        assert patch.is_applied()

        @ray_session.remote
        class Named:
            def ping(self):
                return "pong"

        cls = patch._ActorClassWithNamespace(Named, "transfer_queue.g.p0")
        actor = cls.options(name="TransferQueueController", namespace="transfer_queue").remote()
        # TransferQueue's own lookup (patched) finds it; the fixed namespace does not hold it
        found = tqi.ray.get_actor("TransferQueueController", namespace="transfer_queue")
        assert ray_session.get(found.ping.remote()) == "pong"
        with pytest.raises(ValueError):
            ray_session.get_actor("TransferQueueController", namespace="transfer_queue")
        assert ray_session.get_actor("TransferQueueController", namespace="transfer_queue.g.p0") is not None
        # everything else is the real ray module and the real controller class
        assert tqi.ray.get is ray_session.get and tqi.TransferQueueController._cls is saved[1]
        ray_session.kill(actor)
    finally:
        tqi.ray, tqi.TransferQueueController, ray_storage_client.ray, ray_storage_client.RayObjectRefStorage = saved


def test_refuses_without_a_namespace_or_on_another_release(monkeypatch):
    from jigsaw_verl.patches import transfer_queue_namespace as patch

    monkeypatch.delenv(patch.ENV, raising=False)
    with pytest.raises(RuntimeError, match="JIGSAW_VERL_TQ_NAMESPACE is not set"):
        patch.apply()
    monkeypatch.setenv(patch.ENV, "x")
    monkeypatch.setattr(patch, "installed_version", lambda: "9.9.9")
    with pytest.raises(RuntimeError, match="written for TransferQueue 0.1.11; installed is 9.9.9"):
        patch.apply()


def _in_a_group_only(patch, monkeypatch) -> None:
    """``patch`` refuses outside a multiplexed run; then this test's process is one (its namespace variable set)."""
    monkeypatch.delenv(patch.ENV, raising=False)
    with pytest.raises(RuntimeError, match="JIGSAW_VERL_TQ_NAMESPACE is not set"):
        patch.apply()
    monkeypatch.setenv(patch.ENV, "transfer_queue.g.p0")


def test_storage_units_go_to_the_trainers_node_unless_the_run_names_a_resource(ray_session, monkeypatch):
    """patches/transfer_queue_storage_node.py: TransferQueue's bootstrap asks for one strategy per storage unit; in
    a group each is a hard affinity to the calling process's node (the real function, restored after)."""
    from transfer_queue.storage.bootstrap import simple_storage_bootstrap as bootstrap

    from jigsaw_verl.patches import transfer_queue_storage_node as patch

    saved = bootstrap.get_node_round_robin_scheduling_strategies
    _in_a_group_only(patch, monkeypatch)
    try:
        patch.apply()
        patch.apply()  # idempotent: wrapped once
        assert patch.is_applied() and bootstrap.get_node_round_robin_scheduling_strategies.jigsaw_original is saved
        here = ray_session.get_runtime_context().get_node_id()
        found = bootstrap.get_node_round_robin_scheduling_strategies(3)
        assert [(s.node_id, s.soft) for s in found] == [(here, False)] * 3
        with pytest.raises(ValueError, match="No alive Ray nodes provide custom resource 'nowhere'"):
            bootstrap.get_node_round_robin_scheduling_strategies(1, required_node_resource="nowhere")
    finally:
        bootstrap.get_node_round_robin_scheduling_strategies = saved


def test_reward_loop_workers_go_to_the_trainers_node(ray_session, monkeypatch):
    """patches/reward_loop_node.py: verl's RewardLoopManager places its workers with the patched method (real Ray
    actors standing in for verl's RewardLoopWorker, which needs a whole run's config): on the calling process's
    node, with verl's names and arguments; verl's own method is restored after."""
    from types import SimpleNamespace

    from verl.experimental.reward_loop.reward_loop import RewardLoopManager

    from jigsaw_verl.patches import reward_loop_node as patch

    class Worker:
        def __init__(self, config, router_address):
            self.args = (config.reward.num_workers, router_address)

        def where(self):
            return ray_session.get_runtime_context().get_node_id(), self.args

    saved = RewardLoopManager._init_reward_loop_workers
    _in_a_group_only(patch, monkeypatch)
    try:
        patch.apply()
        assert patch.is_applied()
        manager = SimpleNamespace(
            config=SimpleNamespace(reward=SimpleNamespace(num_workers=2)),
            reward_router_address=None,
            reward_loop_workers_class=ray_session.remote(Worker),
        )
        RewardLoopManager._init_reward_loop_workers(manager)
        here = ray_session.get_runtime_context().get_node_id()
        found = ray_session.get([w.where.remote() for w in manager.reward_loop_workers])
        assert found == [(here, (2, None))] * 2
        for w in manager.reward_loop_workers:
            ray_session.kill(w)
    finally:
        RewardLoopManager._init_reward_loop_workers = saved


def test_agent_loop_workers_go_to_the_managers_node(ray_session):
    """jigsaw_verl.integration.trainer.agent_loop_placement: verl's V1 agent-loop manager with its workers on the
    creating process's node (real Ray actors standing in for verl's AgentLoopWorkerTQ)."""
    import asyncio
    from types import SimpleNamespace

    from jigsaw_verl.integration.main_ppo import NODE_LOCAL_MANAGER
    from jigsaw_verl.integration.trainer.agent_loop_placement import NodeLocalAgentLoopManager

    class Worker:
        def __init__(self, config, llm_client, teacher_client, reward_handles):
            self.args = (config, llm_client, teacher_client, reward_handles)

        def where(self):
            return ray_session.get_runtime_context().get_node_id(), self.args

    assert NODE_LOCAL_MANAGER == f"{NodeLocalAgentLoopManager.__module__}.{NodeLocalAgentLoopManager.__name__}"
    manager = SimpleNamespace(
        config="cfg", llm_client="llm", teacher_client=None, reward_loop_worker_handles=["r"],
        rollout_config=SimpleNamespace(agent=SimpleNamespace(num_workers=3)),
        agent_loop_workers_class=ray_session.remote(Worker),
    )  # fmt: skip
    asyncio.run(NodeLocalAgentLoopManager._init_agent_loop_workers(manager))
    here = ray_session.get_runtime_context().get_node_id()
    found = ray_session.get([w.where.remote() for w in manager.agent_loop_workers])
    assert found == [(here, ("cfg", "llm", None, ["r"]))] * 3
    for w in manager.agent_loop_workers:
        ray_session.kill(w)
