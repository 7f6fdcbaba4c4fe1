"""The pool mechanism both executors apply plans through: one snapshot builder, one hold rule, memory admission.

The live executor runs without Ray here (the test advances its clock), over the tiny CPU model's planning spec.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from test_live_executor_on_cpu import _spec

from jigsaw_verl.model.catalogue import MODELS
from jigsaw_verl.model.graph import LOGPROB, ROLLOUT
from jigsaw_verl.model.slots import CPU_SLOT
from jigsaw_verl.model.spec import ClusterSpec, WorkloadSpec
from jigsaw_verl.policy.interface import ExecutionMode, SchedulerOutput, StartStage
from jigsaw_verl.pool.holds import Hold, Refusal, SlotHolds
from jigsaw_verl.runtime.executor import LiveExecutor, ReplicaReport
from jigsaw_verl.runtime.live_policy import live_policy_factory, live_policy_names
from jigsaw_verl.sim.simulator import Simulator


class _Seen(Exception):
    """Stops the simulation once the state under test is reached."""


class _StartAsRolloutThenWatch:
    """A test policy (the unit under test is the snapshot, not a policy): start a's first rollout on both slots,
    then record the next snapshot (and, in the simulator, stop there)."""

    name = config = "test-start-a-then-watch"
    detailed_snapshot = True

    def __init__(self, *, stop: bool):
        self.stop, self.seen = stop, []

    def mode(self, pipeline):
        return ExecutionMode()

    def schedule(self, snap):
        if not any(v.running for v in snap.pipelines):
            return SchedulerOutput((StartStage("a", 0, ROLLOUT, (0, 1)),))
        self.seen.append(snap)
        if self.stop:
            raise _Seen
        return SchedulerOutput(())


def test_the_simulator_and_the_live_executor_give_the_policy_the_same_snapshot_for_the_same_state():
    """a's rollout runs on two replicas (slots 0 and 1), b waits for its rollout: the simulator reaches this state
    by simulating it; the live executor by the pipelines' requests, with a's replicas reported as the simulator's
    engines hold them. Both snapshots come from the pool's one builder and are equal in every field."""
    specs = (_spec("a"), _spec("b"))
    cluster = ClusterSpec(gpu=CPU_SLOT, num_gpus=2, gpus_per_node=2)
    sim_policy = _StartAsRolloutThenWatch(stop=True)
    sim = Simulator(WorkloadSpec(name="live", seed=0, cluster=cluster, pipelines=specs), sim_policy)
    with pytest.raises(_Seen):
        sim.run()
    (simulated,) = sim_policy.seen

    live_policy = _StartAsRolloutThenWatch(stop=False)
    ex = LiveExecutor(2, CPU_SLOT, lambda workload: live_policy, policy_name="test")
    for spec in specs:
        ex.join(spec, 2, 0.0)
    assert [g.gpus for g in ex.request("a", 0, ROLLOUT, 0.0)] == [(0, 1)]
    engines = {e.worker: e.engine for e in sim.engines}
    reports = [
        ReplicaReport(r.replica, r.live, r.queued, r.context_tokens, r.generated_tokens, engines[r.replica].kv_reserved)
        for r in simulated.replicas
    ]
    assert ex.report_replicas("a", 0, reports, 0.0) == ([], [])
    assert ex.request("b", 0, ROLLOUT, 0.0) == []
    live = live_policy.seen[-1]

    assert simulated.replicas and simulated.leases and simulated.ready  # the state has every part filled
    assert all(b < CPU_SLOT.memory_bytes for b in simulated.free_bytes)  # the replicas' memory is counted
    assert live == simulated


def _co_locate_whatever_is_ready():
    class CoLocate:
        """A test policy: start every ready stage on slot 0 at share 0.3, whoever holds it (memory admission is the
        executor's to enforce here)."""

        name = config = "test-co-locate"

        def mode(self, pipeline):
            return ExecutionMode()

        def schedule(self, snap):
            return SchedulerOutput(tuple(StartStage(r.pipeline, r.step, r.stage, (0,), 0.3) for r in snap.ready))

    return CoLocate()


@pytest.mark.parametrize("a_offloads", [True, False])
def test_a_stage_that_does_not_fit_beside_what_another_pipeline_holds_resident_is_not_co_located(a_offloads):
    """a (a 0.6B model) keeps its training state resident on the one slot between leases unless it offloads; b's
    log-prob pass asks to join a's running rollout there. With a's state resident there is no room (the slot's
    free memory is below zero already): b waits until a's rollout ends; with it offloaded b is co-located at the
    policy's share."""
    a = replace(_spec("a"), model=MODELS["qwen3-0.6b"])
    policy = _co_locate_whatever_is_ready()
    ex = LiveExecutor(1, CPU_SLOT, lambda workload: policy, policy_name="test")
    ex.join(a, 1, 0.0, offload=a_offloads)
    ex.join(_spec("b"), 1, 0.0)
    assert [g.pipeline for g in ex.request("b", 0, ROLLOUT, 0.0)] == ["b"]
    assert ex.request("a", 0, ROLLOUT, 0.0) == []  # two replicas never share a slot
    assert [(g.pipeline, g.sm_share) for g in ex.finish("b", 0, ROLLOUT, 1.0)] == [("a", 1.0)]
    granted = ex.request("b", 0, LOGPROB, 1.0)
    if a_offloads:
        assert ex.free_bytes()[0] > 0 and [(g.stage, g.sm_share) for g in granted] == [(LOGPROB, 0.3)]
    else:
        assert ex.free_bytes()[0] < 0 and granted == []  # a's resident training state alone overfills the slot
        assert [(g.pipeline, g.stage, g.sm_share) for g in ex.finish("a", 0, ROLLOUT, 2.0)] == [("b", LOGPROB, 1.0)]


def test_areal_is_refused_live_and_greedy_and_jigsaw_run():
    with pytest.raises(ValueError, match=r"jigsaw\.mux\.policy='areal' needs asynchronous execution"):
        live_policy_factory("areal")
    assert {"greedy", "jigsaw", "verl"} <= set(live_policy_names())
    assert not {"areal", "streamrl"} & set(live_policy_names())


def test_a_claim_is_refused_not_applied():
    holds = SlotHolds(2)
    rollout = Hold("a", 0, ROLLOUT)
    assert holds.claim(rollout, (0, 1), 1.0, 0.0) == []
    assert holds.claim(Hold("b", 0, ROLLOUT), (0,), 0.5, 1.0) == Refusal("GPU 0 already holds a replica")
    assert holds.claim(Hold("b", 0, LOGPROB), (1,), 1.0, 1.0) == Refusal("GPU 1 is busy")
    assert holds.claim(Hold("a", 0, LOGPROB), (1,), 0.5, 1.0) == Refusal("GPU 1 is held by another stage of a")
    gang = Hold("b", 0, LOGPROB)
    (closed,) = holds.claim(gang, (1,), 0.3, 2.0)  # the occupant's share shrinks: its first segment closes
    assert (closed.hold, closed.share, rollout.shares) == (rollout, 1.0, {0: 1.0, 1: 0.7})
    holds.release(gang, 3.0)  # left alone, the occupant has the whole slot again
    assert rollout.shares == {0: 1.0, 1: 1.0} and rollout.low[1] == 0.7
