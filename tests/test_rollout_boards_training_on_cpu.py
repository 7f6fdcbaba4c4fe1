"""Where one pipeline's stage may join another's GPUs, in one plan and in the look-ahead's model.

A rollout short of GPUs joins another pipeline's training gang; a training stage joins a sync pipeline's rollout
tail, never an async one's (the next step's requests refill it).

The paper setting (two jobs, each rollout one TP-4 replica of the whole 4-GPU pool) is where it matters: b's
rollout can only run beside a's log-prob or update. The policy already did so one decision later; these tests pin
that a plan may hold both starts (so the look-ahead scores what will really happen) and that the roll-forward
predicts such a join, with the training gang slowed and its pipeline's next stage waiting for it.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from jigsaw_verl.model.graph import LOGPROB, ROLLOUT
from jigsaw_verl.model.workload_file import bundled_workloads, load_workload
from jigsaw_verl.policy.interface import Lease, PipelineView, ReadyStage, Snapshot
from jigsaw_verl.policy.jigsaw.knobs import JigsawKnobs
from jigsaw_verl.policy.jigsaw.lookahead import LookAheadPolicy
from jigsaw_verl.policy.jigsaw.rollforward import RollForward

ALL = (0, 1, 2, 3)


def _paper(steps: int = 3):
    (path,) = [p for p in bundled_workloads() if p.name.startswith("paper")]
    w = load_workload(path)
    return replace(w, pipelines=tuple(replace(p, steps=steps) for p in w.pipelines))


def _view(name: str, index: int, running=(), train=()) -> PipelineView:
    return PipelineView(
        name=name, index=index, arrival_s=0.0, arrived=True, started=True, finished=False, version=1, steps_done=1,
        running=running, running_since_s=(100.0,) * len(running), rollout_gpus=frozenset(), train_gpus=train,
    )  # fmt: skip


def _snapshot(*, b_trains: bool) -> Snapshot:
    """At t=100 s: a's rollout of step 1 is ready; b's log-prob of step 1 is either ready too (nothing runs) or
    has just started on the whole pool."""
    running = ((1, LOGPROB, ALL),) if b_trains else ()
    leases = tuple((Lease(pipeline="b", stage=LOGPROB, sm_share=1.0),) if b_trains else () for _ in ALL)
    ready = (ReadyStage("a", 1, ROLLOUT),) + (() if b_trains else (ReadyStage("b", 1, LOGPROB),))
    return Snapshot(
        now_s=100.0, num_gpus=4, free_gpus=frozenset() if b_trains else frozenset(ALL), ready=ready,
        pipelines=(_view("a", 0, train=ALL), _view("b", 1, running, train=ALL)),
        last_pipeline=("b",) * 4, leases=leases, free_bytes=(40e9 if b_trains else 80e9,) * 4, replicas=(),
    )  # fmt: skip


def test_a_plan_may_start_a_training_gang_and_a_rollout_beside_it():
    """Before, the first-fit blocked every GPU the plan itself started on, so this candidate held b's log-prob
    alone and the look-ahead scored a rollout that waits for it, though the next decision at the same instant
    started it beside the gang."""
    w = _paper()
    policy = LookAheadPolicy(w, JigsawKnobs(), name="jigsaw")
    snap = _snapshot(b_trains=False)
    plan = policy._fill(snap, set(ALL), [ReadyStage("b", 1, LOGPROB), ReadyStage("a", 1, ROLLOUT)])
    assert [(a.pipeline, a.stage, a.gpus) for a in plan] == [("b", LOGPROB, ALL), ("a", ROLLOUT, ALL)]
    gang, rollout = plan
    assert gang.sm_share == 1.0 and rollout.sm_share == pytest.approx(policy.planning.tail_share)
    # without co-location the rollout waits, as before
    plan = policy._fill(snap, set(ALL), [ReadyStage("b", 1, LOGPROB), ReadyStage("a", 1, ROLLOUT)], colocate=False)
    assert [a.pipeline for a in plan] == ["b"]


def test_the_roll_forward_predicts_a_rollout_joining_a_training_gang():
    """a's rollout, short of GPUs while b's log-prob holds the pool, is predicted to run beside it from now (not
    after it), both at the cost model's co-location speeds: b's log-prob ends later and b's next stage waits for
    that later end."""
    w = _paper()
    snap = _snapshot(b_trains=True)
    scores = {}
    for colocation in (True, False):
        policy = LookAheadPolicy(w, JigsawKnobs(horizon=1, colocation=colocation), name="jigsaw")
        rf = RollForward(policy.planning, snap)
        scores[colocation] = rf.score(())
        b_left = rf.stage_end["b"] - snap.now_s
        rollout = rf.dur("a", ROLLOUT, 4)
    rollout_speed, gang_speed = policy.planning.boarding_speeds("a")
    assert 0 < rollout_speed < 1 and 0 < gang_speed < 1
    joined = (rollout / rollout_speed, b_left / gang_speed)  # a's rollout ends; b's log-prob ends, slowed
    waited = (b_left + rollout, b_left)

    def score(ends):  # the latest completion plus the mean (RollForward.score, one stage each)
        return max(ends) + sum(ends) / 2

    assert scores[True] == pytest.approx(score(joined), rel=1e-6)
    assert scores[False] == pytest.approx(score(waited), rel=1e-6)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_training_joins_a_sync_tail_but_not_an_async_one(mode):
    """b's replicas hold the whole 2-GPU pool with one live request each and nothing queued, and a's log-prob is
    ready. A sync b is in its tail: a's log-prob joins it. An async b takes its next step's requests as soon as its
    weights allow (AReaL-style overlap), so its tail is refilled, not idle: nothing joins it."""
    from conftest import tiny_pipeline, tiny_workload_dict

    from jigsaw_verl.model.spec import workload_from_dict
    from jigsaw_verl.policy.interface import ReplicaView

    extra = {"mode": "async", "max_staleness": 1} if mode == "async" else {}
    pipes = [tiny_pipeline("a"), tiny_pipeline("b", **extra)]
    w = workload_from_dict(tiny_workload_dict(num_gpus=2, pipelines=pipes), "t.yaml")
    replicas = tuple(
        ReplicaView(replica=g, pipeline="b", step=2, gpus=(g,), live=1, queued=0, context_tokens=900,
                    generated_tokens=800, started_s=50.0)
        for g in (0, 1)
    )  # fmt: skip
    snap = Snapshot(
        now_s=100.0, num_gpus=2, free_gpus=frozenset(), ready=(ReadyStage("a", 1, LOGPROB),),
        pipelines=(_view("a", 0), _view("b", 1, ((2, ROLLOUT, (0, 1)),))), last_pipeline=("b", "b"),
        leases=tuple((Lease(pipeline="b", stage=ROLLOUT, sm_share=1.0, replica=g),) for g in (0, 1)),
        free_bytes=(60e9, 60e9), replicas=replicas,
    )  # fmt: skip
    policy = LookAheadPolicy(w, JigsawKnobs(), name="greedy")
    starts = [(a.pipeline, a.stage) for a in policy._fill(snap, set(), list(snap.ready))]
    assert starts == ([("a", LOGPROB)] if mode == "sync" else [])


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_sync_log_prob_widens_onto_tails_only_when_short(mode):
    """GPUs 0-1 are free, b's tail holds 2-3, a's log-prob is ready. An async a widens onto the tail (four GPUs at
    the tail share beat two). A sync a stays on its two free GPUs: its training home would grow onto b's tail, and
    its weight sync, which never joins a rollout, would then wait for that tail to end."""
    from conftest import tiny_pipeline, tiny_workload_dict

    from jigsaw_verl.model.spec import workload_from_dict
    from jigsaw_verl.policy.interface import ReplicaView

    extra = {"mode": "async", "max_staleness": 1} if mode == "async" else {}
    w = workload_from_dict(tiny_workload_dict(pipelines=[tiny_pipeline("a", **extra), tiny_pipeline("b")]), "t")
    replicas = tuple(
        ReplicaView(replica=g, pipeline="b", step=2, gpus=(g,), live=1, queued=0, context_tokens=900,
                    generated_tokens=800, started_s=50.0)
        for g in (2, 3)
    )  # fmt: skip
    leases = ((), ()) + tuple((Lease(pipeline="b", stage=ROLLOUT, sm_share=1.0, replica=g),) for g in (2, 3))
    snap = Snapshot(
        now_s=100.0, num_gpus=4, free_gpus=frozenset({0, 1}), ready=(ReadyStage("a", 1, LOGPROB),),
        pipelines=(_view("a", 0), _view("b", 1, ((2, ROLLOUT, (2, 3)),))), last_pipeline=("a", "a", "b", "b"),
        leases=leases, free_bytes=(80e9, 80e9, 60e9, 60e9), replicas=replicas,
    )  # fmt: skip
    policy = LookAheadPolicy(w, JigsawKnobs(), name="greedy")
    (start,) = policy._fill(snap, {0, 1}, list(snap.ready))
    assert start.gpus == ((0, 1) if mode == "sync" else (0, 1, 2, 3))
