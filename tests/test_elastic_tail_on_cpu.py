"""Elastic tail parallelism: a rollout's long tail moved onto one wider replica (simulation only).

The simulator executes :class:`WidenTail` (abort, a new replica of larger TP, re-prefill at its rate), refuses what
a pool cannot do, the planner prices it, the jigsaw policy takes it where it pays, the live executor refuses
pipelines that would need it, and the lower bound stays a bound for schedules that use it
(``tests/test_lower_bound_on_cpu.py`` enumerates them by brute force).
"""

from __future__ import annotations

import pytest
from conftest import TINY_MODEL, tiny_pipeline, tiny_workload_dict
from schedule_checks import check_all
from test_lower_bound_on_cpu import brute_force
from test_simulator_on_cpu import configurations

from jigsaw_verl.model.cost_model import CostModel
from jigsaw_verl.model.graph import ROLLOUT
from jigsaw_verl.model.spec import SpecError, workload_from_dict
from jigsaw_verl.policy.interface import ReplicaView, SchedulerOutput, StartStage, WidenTail
from jigsaw_verl.policy.jigsaw.knobs import JigsawKnobs
from jigsaw_verl.policy.jigsaw.lookahead import LookAheadPolicy
from jigsaw_verl.policy.jigsaw.migration_planner import plan_widening
from jigsaw_verl.sim.lower_bound import lower_bound
from jigsaw_verl.sim.simulator import SimulationError, Simulator


def long_cot(elastic: int | None, num_gpus: int = 4, steps: int = 1) -> dict:
    """One Qwen3-4B GRPO job whose rollout has a long tail, on ``num_gpus`` H100s (one node)."""
    p = {
        "name": "a",
        "model": "qwen3-4b",
        "batch_prompts": 16,
        "group_size": 4,
        "prompt_len": {"median": 150, "p99": 450, "max": 512},
        "response_len": {"median": 800, "p99": 8000, "max": 8192, "group_corr": 0.6},
        "steps": steps,
    }
    if elastic:
        p["rollout_elastic_tp"] = elastic
    return {"name": "long-cot", "seed": 0, "cluster": {"gpu": "H100-80G", "num_gpus": num_gpus}, "pipelines": [p]}


class WideningPolicy:
    """Greedy, except that once a pipeline's rollout has nothing queued and at most ``live`` requests live, its whole
    tail moves onto one replica of its ``rollout_elastic_tp`` on the lowest of its own GPUs (once per step)."""

    detailed_snapshot = True

    def __init__(self, w, live: int = 8):
        self.w, self.live = w, live
        self.inner = LookAheadPolicy(w, JigsawKnobs(horizon=0, colocation=False, migration=False), name="greedy")
        self.name, self.config = "widening", "test"

    def mode(self, pipeline):
        return self.inner.mode(pipeline)

    def schedule(self, snap):
        for p in self.w.pipelines:
            reps = [r for r in snap.replicas if r.pipeline == p.name]
            wide = p.rollout_elastic_tp or 0
            if reps and max(len(r.gpus) for r in reps) < wide and all(r.queued == 0 for r in reps):
                if sum(r.live for r in reps) <= self.live:
                    own = sorted(g for r in reps for g in r.gpus)
                    return SchedulerOutput((WidenTail(p.name, tuple(r.replica for r in reps), tuple(own[:wide])),))
        return self.inner.schedule(snap)


def rollout_s(result, step: int = 0) -> float:
    (s,) = [s for s in result.stages if s.stage == ROLLOUT and s.step == step]
    return s.end_s - s.start_s


def test_a_tail_moved_to_a_wider_replica_loses_no_token_and_ends_sooner():
    w = workload_from_dict(long_cot(elastic=4), "long-cot")
    plain = Simulator(w, WideningPolicy(w, live=0)).run()  # live=0: never moves (a tail always has live requests)
    wide = Simulator(w, WideningPolicy(w)).run()
    check_all(w, wide)  # every response generated exactly its length, once; the move's replica on one node
    (m,) = wide.migrations
    assert m.wide_tp == 4 and m.targets == (0, 1, 2, 3) and 0 < m.requests <= 8 and m.reprefill_tokens > 0
    assert not plain.migrations
    # the wide replica re-prefills the moved requests as soon as its weights are in, then decodes them faster
    assert any(s.name in ("prefill", "reprefill") and s.gpus == (0, 1, 2, 3) for s in wide.slices)
    assert rollout_s(wide) < 0.9 * rollout_s(plain)


def test_the_simulator_refuses_a_tail_move_the_pool_cannot_make():
    class Scripted:
        name, config, detailed_snapshot = "scripted", "test", True

        def __init__(self, w, move):
            self.inner = WideningPolicy(w, live=0)
            self.move, self.done = move, False

        def mode(self, pipeline):
            return self.inner.mode(pipeline)

        def schedule(self, snap):
            reps = [r for r in snap.replicas if r.pipeline == "a"]
            if reps and not self.done and all(r.queued == 0 for r in reps):
                self.done = True
                return SchedulerOutput((self.move(reps),))
            return self.inner.schedule(snap)

    w = workload_from_dict(
        long_cot(elastic=2, num_gpus=4) | {"cluster": {"gpu": "H100-80G", "num_gpus": 4, "gpus_per_node": 2}},
        "two-nodes",
    )
    ids = lambda reps: tuple(r.replica for r in reps)  # noqa: E731
    with pytest.raises(SimulationError, match="one node"):
        Simulator(w, Scripted(w, lambda reps: WidenTail("a", ids(reps), (1, 2)))).run()
    with pytest.raises(SimulationError, match="not wider"):
        Simulator(w, Scripted(w, lambda reps: WidenTail("a", ids(reps), (0,)))).run()
    with pytest.raises(SimulationError, match="rollout_elastic_tp"):
        Simulator(w, Scripted(w, lambda reps: WidenTail("a", ids(reps), (0, 1, 2, 3)))).run()
    with pytest.raises(SimulationError, match="live ones"):
        Simulator(w, Scripted(w, lambda reps: WidenTail("a", (99,), (0, 1)))).run()
    plain = workload_from_dict(long_cot(elastic=None, num_gpus=4), "plain")
    with pytest.raises(SimulationError, match="rollout_elastic_tp"):
        Simulator(plain, Scripted(plain, lambda reps: WidenTail("a", ids(reps), (0, 1)))).run()


def test_a_tail_move_needs_gpus_that_are_free_or_its_own():
    two = tiny_workload_dict(
        num_gpus=2,
        pipelines=[
            tiny_pipeline("a", steps=1, rollout_elastic_tp=2, response_len={"median": 900, "p99": 1000, "max": 1024}),
            tiny_pipeline("b", steps=1, response_len={"median": 900, "p99": 1000, "max": 1024}),
        ],
    )
    w = workload_from_dict(two, "two")

    class Busy:
        name, config, detailed_snapshot = "busy", "test", True
        started = False

        def mode(self, pipeline):
            return WideningPolicy(w).mode(pipeline)

        def schedule(self, snap):
            if not self.started:
                self.started = True
                return SchedulerOutput((StartStage("a", 0, ROLLOUT, (0,)), StartStage("b", 0, ROLLOUT, (1,))))
            (ra,) = [r for r in snap.replicas if r.pipeline == "a"]
            return SchedulerOutput((WidenTail("a", (ra.replica,), (0, 1)),))

    with pytest.raises(SimulationError, match="free or the sources' own"):
        Simulator(w, Busy()).run()


def test_the_planner_prices_a_move_and_prefers_the_pipelines_own_gpus():
    w = workload_from_dict(long_cot(elastic=4), "long-cot")
    spec, cost = w.pipelines[0], CostModel(w.cluster.gpu)

    def rep(i, live, ctx, queued=0):
        return ReplicaView(
            replica=i,
            pipeline="a",
            step=0,
            gpus=(i,),
            live=live,
            queued=queued,
            context_tokens=ctx,
            generated_tokens=ctx // 2,
            started_s=0.0,
        )

    reps = [rep(0, 2, 12000), rep(1, 1, 7000)]
    plan = plan_widening(spec, cost, reps, [30.0, 20.0], frozenset({2, 3}), 4)
    assert plan is not None and plan.action.gpus == (0, 1, 2, 3) and plan.taken_gpus == (2, 3)
    assert plan.before_s == 30.0 and cost.tail_move_load(spec.model, 4) < plan.end_s < plan.before_s
    # with no free GPU, the widest replica its own GPUs make; no room for a wider one, something still queued, or a
    # tail too short to pay the move: no plan
    assert plan_widening(spec, cost, reps, [30.0, 20.0], frozenset(), 4).action.gpus == (0, 1)
    assert plan_widening(spec, cost, reps[:1], [30.0], frozenset({3}), 4) is None
    assert (
        plan_widening(spec, cost, [rep(0, 2, 12000, queued=1), rep(1, 1, 7000)], [30.0, 20.0], frozenset({2, 3}), 4)
        is None
    )
    assert plan_widening(spec, cost, reps, [1.0, 0.5], frozenset({2, 3}), 4) is None


def test_jigsaw_moves_long_tails_when_it_pays_and_keeps_its_plans_valid():
    w = workload_from_dict(long_cot(elastic=4, steps=3), "long-cot")
    (jigsaw,) = configurations("jigsaw", w)
    r = Simulator(w, jigsaw).run()
    check_all(w, r)
    assert any(m.wide_tp == 4 for m in r.migrations)
    off = LookAheadPolicy(w, JigsawKnobs(elastic_tail=False), name="jigsaw-no-elastic-tail")
    assert r.makespan_s < Simulator(w, off).run().makespan_s


def test_the_bound_lets_a_response_decode_at_the_widest_tp_and_no_tail_move_beats_it():
    w = workload_from_dict(long_cot(elastic=4), "long-cot")
    plain = workload_from_dict(long_cot(elastic=None), "plain")
    for r in (Simulator(w, WideningPolicy(w)).run(), Simulator(w, WideningPolicy(w, live=64)).run()):
        # faster than any schedule at the declared TP can be: the bound had to let the tail decode wider
        assert lower_bound(w).makespan_s <= r.makespan_s < lower_bound(plain).makespan_s
    two = workload_from_dict(
        tiny_workload_dict(
            num_gpus=2,
            pipelines=[
                tiny_pipeline(
                    "a",
                    steps=1,
                    batch_prompts=1,
                    group_size=2,
                    rollout_elastic_tp=2,
                    model=TINY_MODEL,
                    response_len={"median": 300, "p99": 1000, "max": 1024},
                )
            ],
        ),
        "two",
    )
    moved = 0
    for r in brute_force(two, leaves=200):
        check_all(two, r)
        assert r.makespan_s >= lower_bound(two).makespan_s * (1 - 1e-9), r.config
        moved += any(m.wide_tp for m in r.migrations)
    assert moved > 10  # the enumeration really contains schedules with tail moves


def test_bad_elastic_tp_is_one_line_naming_the_key():
    bad = long_cot(elastic=3)
    with pytest.raises(SpecError, match=r"pipelines\[0\]\.rollout_elastic_tp.*divides gpus_per_node"):
        workload_from_dict(bad, "bad")
    bad = long_cot(elastic=16, num_gpus=4)
    with pytest.raises(SpecError, match="rollout_elastic_tp"):
        workload_from_dict(bad, "bad")
    bad = long_cot(elastic=None)
    bad["pipelines"][0]["rollout_elastic_tp"] = "wide"
    with pytest.raises(SpecError, match="rollout_elastic_tp: expected an integer"):
        workload_from_dict(bad, "bad")
