"""The replay of a live group (no Ray): pipelines ask the real live executor for their leases in verl's order on a
simulated clock, each lease taking its alone time, leases on one slot time-sharing it."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from jigsaw_verl.model.catalogue import ModelSpec
from jigsaw_verl.model.graph import INIT, LOGPROB, ROLLOUT, UPDATE, WEIGHT_SYNC
from jigsaw_verl.model.slots import CPU_SLOT
from jigsaw_verl.model.spec import LengthDist, PipelineSpec
from jigsaw_verl.model.spec_record import gpu_from_record, pipeline_from_record, spec_record
from jigsaw_verl.model.topology import PoolTopology
from jigsaw_verl.policy.interface import ExecutionMode, SchedulerOutput, StartStage
from jigsaw_verl.report.live_run import live_run_of
from jigsaw_verl.report.live_stage_times import (
    AloneTimes,
    alone_times,
    makespan_bound_s,
    shared_home_bound_s,
    steady_chain_s,
    steady_slot_seconds,
)
from jigsaw_verl.runtime.live_replay import LiveReplay, ReplayPipeline, lease_script
from jigsaw_verl.runtime.replay_group import predict_group, start_ups

TINY = ModelSpec(name="tiny", params=6.45e5, layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16)
STEPS = 3
# alone seconds of each lease, and the trainer's work after a lease of that stage
ALONE = {INIT: 10.0, ROLLOUT: 3.0, LOGPROB: 1.0, UPDATE: 2.0, WEIGHT_SYNC: 0.5}
GAPS = {INIT: 1.0, LOGPROB: 0.0, UPDATE: 0.25, ROLLOUT: 0.0, WEIGHT_SYNC: 0.0}


def _spec(name: str) -> PipelineSpec:
    lengths = LengthDist(median=8.0, p99=32.0, max=32)
    return PipelineSpec(name=name, model=TINY, prompt_len=lengths, response_len=lengths, steps=STEPS, batch_prompts=8)


# a stage on two slots alone: faster than on one, but not twice as fast (a rollout is its tail)
SPEEDUP_ON_TWO = {INIT: 1.0, ROLLOUT: 1.2, LOGPROB: 1.6, UPDATE: 1.5, WEIGHT_SYNC: 1.0}


def _times(name: str, slots: int, scale: dict | None = None) -> AloneTimes:
    alone = {s: t / (scale or {}).get(s, 1.0) for s, t in ALONE.items()}
    durations = {(-1, INIT): alone[INIT], (-1, WEIGHT_SYNC): alone[WEIGHT_SYNC]}
    durations |= {(k, s): alone[s] for k in range(STEPS) for s in (ROLLOUT, LOGPROB, UPDATE, WEIGHT_SYNC)}
    offsets = {k: (1.0, 2.0, 3.0) for k in range(STEPS)}
    return AloneTimes(pipeline=name, slots=slots, durations=durations, gaps=GAPS, finish_offsets=offsets)


def _replay(policy: str, slots: int, homes=(None, None), factory=None, scale=None) -> list[dict]:
    pipes = [ReplayPipeline(_spec(n), slots, _times(n, slots, scale), home=h) for n, h in zip("ab", homes, strict=True)]
    return LiveReplay(pipes, PoolTopology(2, 2), CPU_SLOT, policy, policy_factory=factory).run().leases


def _chain() -> float:
    """One pipeline's steady state alone: first rollout's start to its last update's end."""
    step = ALONE[ROLLOUT] + ALONE[LOGPROB] + ALONE[UPDATE] + ALONE[WEIGHT_SYNC] + GAPS[UPDATE]
    return STEPS * step - ALONE[WEIGHT_SYNC] - GAPS[UPDATE]


def _makespan(leases: list[dict]) -> float:
    return live_run_of(leases, 2, {}, group_size=4, batch_prompts=8).makespan_s


def test_the_script_is_verls_order_of_leases():
    assert lease_script(2) == [
        ("request", -1, INIT),
        ("request", -1, WEIGHT_SYNC),
        ("handover", 0, ROLLOUT),
        ("request", 0, LOGPROB),
        ("request", 0, UPDATE),
        ("request", 0, WEIGHT_SYNC),
        ("handover", 1, ROLLOUT),
        ("request", 1, LOGPROB),
        ("request", 1, UPDATE),
    ]


def test_verl_split_runs_the_two_side_by_side_and_verl_seq_one_after_the_other():
    split = _replay("verl-split", 1, homes=((0,), (1,)))
    assert _makespan(split) == pytest.approx(_chain())
    seq = _replay("verl-seq", 2)
    assert all(tuple(lease["gpus"]) == (0, 1) for lease in seq)
    first = {(s["pipeline"], s["step"], s["stage"]): s for s in seq}
    # b starts up after a (start-up is alone on the home), then its first sync waits until a's last update is done
    assert first[("b", -1, INIT)]["start_s"] == pytest.approx(ALONE[INIT])
    assert first[("b", -1, WEIGHT_SYNC)]["start_s"] == pytest.approx(first[("a", STEPS - 1, UPDATE)]["end_s"])
    assert _makespan(seq) == pytest.approx(2 * _chain() + ALONE[WEIGHT_SYNC])


@dataclass
class ShareEverything:
    """A test policy (not a registered one): every ready stage starts at once at half of both slots."""

    name: str = "share-everything"
    config: str = "test"

    def mode(self, pipeline: str) -> ExecutionMode:
        return ExecutionMode()

    def schedule(self, snapshot) -> SchedulerOutput:
        starts = tuple(StartStage(r.pipeline, r.step, r.stage, (0, 1), 0.5) for r in snapshot.ready)
        return SchedulerOutput(actions=starts)


def test_leases_on_one_slot_time_share_it():
    leases = _replay("share-everything", 2, factory=lambda workload: ShareEverything())
    span = {}
    for s in leases:
        key = (s["pipeline"], s["step"], s["stage"])
        lo, hi = span.get(key, (s["start_s"], s["end_s"]))
        span[key] = (min(lo, s["start_s"]), max(hi, s["end_s"]))
    # b's first rollout runs beside a's log-prob, then a's update, all at half the slots' speed (two rollouts never
    # share a slot: b's starts when a's has ended)
    assert span[("b", 0, ROLLOUT)][0] == pytest.approx(span[("a", 0, ROLLOUT)][1] + ALONE[WEIGHT_SYNC])
    assert span[("a", 0, LOGPROB)][0] == pytest.approx(span[("b", 0, ROLLOUT)][0])
    assert span[("a", 0, LOGPROB)][1] - span[("a", 0, LOGPROB)][0] == pytest.approx(2 * ALONE[LOGPROB])
    assert span[("b", 0, ROLLOUT)][1] - span[("b", 0, ROLLOUT)][0] == pytest.approx(2 * ALONE[ROLLOUT])


def test_jigsaw_replays_to_the_end_within_the_bounds_of_the_baselines():
    leases = _replay("jigsaw", 2)
    stages = {(s["pipeline"], s["step"], s["stage"]) for s in leases}
    assert {(p, k, s) for p in "ab" for k in range(STEPS) for s in (ROLLOUT, LOGPROB, UPDATE)} <= stages
    # never faster than the work allows (two chains on a pool that time-shares), never slower than back to back
    assert _chain() <= _makespan(leases) <= 2 * _chain() + ALONE[INIT] + GAPS[INIT] + ALONE[WEIGHT_SYNC]


def test_alone_times_read_back_a_runs_leases_merged_with_the_trainers_gaps(tmp_path):
    leases = _replay("verl-split", 1, homes=((0,), (1,)))
    (tmp_path / "leases.json").write_text(json.dumps(leases))
    history = [
        {"pipeline": p, "step": k, "stage": ROLLOUT, "finish_offsets_s": [1.0, 3.0]} for p in "ab" for k in range(3)
    ]
    (tmp_path / "stage_times.json").write_text(json.dumps(history))
    times = alone_times(tmp_path)
    assert sorted(times) == ["a", "b"]
    assert times["a"].slots == 1
    assert times["a"].duration(1, ROLLOUT) == pytest.approx(ALONE[ROLLOUT])
    assert times["a"].duration(-1, INIT) == pytest.approx(ALONE[INIT])
    assert times["a"].gaps[UPDATE] == pytest.approx(GAPS[UPDATE])
    assert times["a"].gaps[INIT] == pytest.approx(GAPS[INIT])
    assert times["b"].finish_offsets[2] == (1.0, 3.0)


def test_spec_records_round_trip():
    spec = _spec("a")
    assert pipeline_from_record(json.loads(json.dumps(spec_record(spec)))) == spec
    assert gpu_from_record(json.loads(json.dumps(spec_record(CPU_SLOT)))) == CPU_SLOT
    with pytest.raises(ValueError, match="not a pipeline spec record"):
        pipeline_from_record({"name": "a"})


def test_no_replayed_schedule_beats_the_makespan_bound():
    widths = {1: {n: _times(n, 1) for n in "ab"}, 2: {n: _times(n, 2, SPEEDUP_ON_TWO) for n in "ab"}}
    bound = makespan_bound_s(widths, 2, STEPS)
    # the bound is the larger of the fastest chain (on two slots) and the least slot-seconds (on one) over the pool
    chain = steady_chain_s(widths[2]["a"], STEPS)
    assert chain < steady_chain_s(widths[1]["a"], STEPS)
    assert bound == pytest.approx(max(chain, 2 * steady_slot_seconds(widths[1]["a"], STEPS) / 2))
    runs = {"verl-split": _replay("verl-split", 1, homes=((0,), (1,)))}
    runs |= {p: _replay(p, 2, scale=SPEEDUP_ON_TWO) for p in ("verl-seq", "jigsaw", "greedy")}
    for policy, leases in runs.items():
        assert _makespan(leases) >= bound - 1e-6, policy


def test_pipelines_on_one_home_roll_out_one_at_a_time_and_the_replay_never_beats_that():
    times = {n: _times(n, 2, SPEEDUP_ON_TWO) for n in "ab"}
    floor = shared_home_bound_s(times, {"a": (0, 1), "b": (0, 1)}, STEPS)
    assert floor == pytest.approx(2 * STEPS * ALONE[ROLLOUT] / SPEEDUP_ON_TWO[ROLLOUT])
    # on homes of their own nothing serialises them: the bound is one pipeline's rollouts
    assert shared_home_bound_s(times, {"a": (0,), "b": (1,)}, STEPS) == pytest.approx(floor / 2)
    for policy in ("jigsaw", "greedy", "verl-seq"):
        leases = _replay(policy, 2, scale=SPEEDUP_ON_TWO)
        spans = sorted(
            (min(s["start_s"] for s in mine), max(s["end_s"] for s in mine))
            for key in {(s["pipeline"], s["step"]) for s in leases if s["stage"] == ROLLOUT}
            if (mine := [s for s in leases if s["stage"] == ROLLOUT and (s["pipeline"], s["step"]) == key])
        )
        assert all(a[1] <= b[0] + 1e-9 for a, b in zip(spans, spans[1:], strict=False)), (policy, spans)
        assert _makespan(leases) >= floor - 1e-6, policy


def test_a_group_replayed_from_its_own_files_comes_out_as_it_ran(tmp_path):
    leases = _replay("verl-split", 1, homes=((0,), (1,)))
    history = [{"pipeline": p, "step": k, "stage": ROLLOUT, "finish_offsets_s": [1.0]} for p in "ab" for k in range(3)]
    joined = [
        {
            "spec": spec_record(_spec(n)),
            "slots": 1,
            "offload": True,
            "engine": None,
            "home": [i],
            "joined_s": 0.0,
            "requested_s": {INIT: 0.0, WEIGHT_SYNC: ALONE[INIT] + GAPS[INIT]},
        }
        for i, n in enumerate("ab")
    ]
    group = {"policy": "verl-split", "num_slots": 2, "slots_per_node": 2, "slot": spec_record(CPU_SLOT)}
    (tmp_path / "group.json").write_text(json.dumps({**group, "pipelines": joined}))
    (tmp_path / "leases.json").write_text(json.dumps(leases))
    (tmp_path / "stage_times.json").write_text(json.dumps(history))
    assert start_ups(json.loads((tmp_path / "group.json").read_text()), leases) == {
        n: (pytest.approx(ALONE[INIT]), pytest.approx(GAPS[INIT])) for n in "ab"
    }
    run = predict_group(tmp_path, {1: tmp_path}, group_size=4, batch_prompts=8)
    assert run.makespan_s == pytest.approx(_makespan(leases))
    with pytest.raises(ValueError, match="no baseline run of 'a' alone on 1 slot"):
        predict_group(tmp_path, {2: tmp_path}, group_size=4, batch_prompts=8)
