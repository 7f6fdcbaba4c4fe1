"""The live executor without Ray: pipelines walk their stages against a clock the test advances; the grants come
from the same core policies the simulator runs."""

from __future__ import annotations

import dataclasses

import pytest

from jigsaw_verl.integration.cpu.assets import build_tiny_assets
from jigsaw_verl.integration.pipeline_spec import pipeline_spec_from_verl
from jigsaw_verl.model.graph import STAGES, WEIGHT_SYNC
from jigsaw_verl.model.slots import CPU_SLOT
from jigsaw_verl.policy.interface import ExecutionMode, Migrate, SchedulerOutput, StartStage
from jigsaw_verl.runtime.executor import LiveExecutor, MigrationOrder, PolicyRefused, PoolTooSmall, ReplicaReport
from jigsaw_verl.runtime.live_policy import live_policy_factory

DURATION = {"rollout": 3.0, "logprob": 1.0, "update": 2.0, "weight_sync": 0.5}


def _spec(name: str, steps: int = 3):
    config = {
        "actor_rollout_ref": {"model": {"path": str(build_tiny_assets().model)}, "rollout": {"n": 4},
                              "actor": {"use_kl_loss": True}},
        "data": {"train_batch_size": 8, "max_prompt_length": 64, "max_response_length": 24},
        "trainer": {"total_training_steps": steps},
    }  # fmt: skip
    return pipeline_spec_from_verl(name, config)


def _executor(slots: int, policy: str = "jigsaw") -> LiveExecutor:
    return LiveExecutor(slots, CPU_SLOT, live_policy_factory(policy), policy_name=policy)


def _run(ex: LiveExecutor, names: list[str], steps: int = 3, crash: str | None = None):
    """Each pipeline asks for its stages in verl's order; a stage takes DURATION; returns the finish times."""
    todo = {n: [(k, s) for k in range(steps) for s in STAGES] for n in names}
    running: dict[str, tuple[float, int, str]] = {}
    finished: dict[str, float] = {}
    now = 0.0

    def start(grants):
        for g in grants:
            assert g.pipeline not in running, "two stages of one pipeline at once"
            running[g.pipeline] = (now + DURATION[g.stage], g.step, g.stage)

    for n in names:
        start(ex.request(n, *todo[n].pop(0), now))
    while running:
        name, (end, step, stage) = min(running.items(), key=lambda kv: (kv[1][0], kv[0]))
        now = end
        del running[name]
        if name == crash and step == 1:
            start(ex.leave(name, now, "crashed"))
            continue
        start(ex.finish(name, step, stage, now))
        if todo[name]:
            start(ex.request(name, *todo[name].pop(0), now))
        else:
            finished[name] = now
            start(ex.leave(name, now))
    return finished


def _check_leases(ex: LiveExecutor):
    for slot in range(ex.num_slots):
        mine = [s for s in ex.slices if slot in s.gpus]
        for t in {s.start_s for s in mine}:
            assert sum(s.sm_share for s in mine if s.start_s <= t < s.end_s) <= 1.0 + 1e-9


@pytest.mark.parametrize("policy", ["jigsaw", "greedy"])
def test_two_pipelines_run_every_stage_in_order_without_oversubscribing(policy):
    ex = _executor(2, policy)
    for n in ("a", "b"):
        ex.join(_spec(n), 2, 0.0)
    finished = _run(ex, ["a", "b"])
    assert sorted(finished) == ["a", "b"]
    for n in ("a", "b"):
        # one slice per segment of constant share: a stage co-located with another has several
        ran = dict.fromkeys((s.step, s.stage) for s in sorted(ex.slices, key=lambda s: s.start_s) if s.pipeline == n)
        assert list(ran) == [(k, st) for k in range(3) for st in STAGES]
        # the policy decides every stage except verl's sync after the last step, which its graph does not have
        assert {(s.step, s.stage) for s in ex.slices if s.pipeline == n and s.forced} == {(2, WEIGHT_SYNC)}
    _check_leases(ex)
    assert not ex.policy_errors


def test_a_pipeline_too_big_for_the_pool_is_refused_alone():
    ex = _executor(2)
    ex.join(_spec("a"), 2, 0.0)
    with pytest.raises(PoolTooSmall, match="pipeline 'big' needs 4 slots but the group's pool has 2"):
        ex.join(_spec("big"), 4, 0.0)
    assert sorted(ex.pipes) == ["a"]
    assert sorted(_run(ex, ["a"])) == ["a"]  # the other pipeline is unaffected


def test_a_crashed_pipeline_gives_its_leases_back_and_the_other_finishes():
    ex = _executor(2)
    for n in ("a", "b"):
        ex.join(_spec(n), 2, 0.0)
    finished = _run(ex, ["a", "b"], crash="a")
    assert sorted(finished) == ["b"] and ex.left["a"] == "crashed"
    assert ex.free_slots() == [0, 1]
    _check_leases(ex)


def test_bad_requests_are_refused():
    ex = _executor(2)
    ex.join(_spec("a"), 2, 0.0)
    with pytest.raises(KeyError, match="'zz' has not joined"):
        ex.request("zz", 0, "rollout", 0.0)
    with pytest.raises(ValueError, match="unknown stage 'train'"):
        ex.request("a", 0, "train", 0.0)
    with pytest.raises(ValueError, match="already joined"):
        ex.join(_spec("a"), 2, 0.0)
    with pytest.raises(ValueError, match="not granted"):
        ex.finish("a", 0, "update", 0.0)
    with pytest.raises(PolicyRefused, match="jigsaw.mux.policy='nope' is unknown"):
        live_policy_factory("nope")
    wide = dataclasses.replace(_spec("w"), rollout_elastic_tp=2)  # a tail move is simulation only
    with pytest.raises(PolicyRefused, match="rollout_elastic_tp=2: verl 0.9.1 builds its rollout replicas at one"):
        ex.join(wide, 2, 0.0)
    assert "w" not in ex.pipes


def test_homes_spread_pipelines_over_the_pool_and_every_grant_is_on_the_home():
    ex = _executor(4)
    for n, slots in (("a", 2), ("b", 2), ("c", 1), ("d", 3)):
        ex.join(_spec(n), slots, 0.0)
    assert [ex.home(n) for n in "abcd"] == [(0, 1), (2, 3), (0,), (1, 2, 3)]
    homes = {n: ex.home(n) for n in "abcd"}
    assert sorted(_run(ex, list("abcd"))) == list("abcd")
    held: dict[tuple, set] = {}
    for s in ex.slices:  # a stage's slices (one per segment of constant share) cover exactly its home
        held.setdefault((s.pipeline, s.step, s.stage), set()).update(s.gpus)
    assert len(held) == 4 * 3 * len(STAGES)
    assert all(gpus == set(homes[key[0]]) for key, gpus in held.items())
    _check_leases(ex)


class _MigrateForTheWaiting:
    """A test policy (the unit under test is the executor's handling of ``Migrate``, not a policy's judgement):
    when every replica of a rollout holds exactly one live request and another pipeline waits, merge the replicas on
    the waiting pipelines' homes onto the others; start every ready stage on the free slots."""

    name = config = "test-migrate-for-the-waiting"

    def __init__(self, homes):
        self.homes = homes

    def mode(self, pipeline):
        return ExecutionMode()

    def schedule(self, snap):
        actions = []
        waiting = {r.pipeline for r in snap.ready}
        by_pipe = {}
        for rep in snap.replicas:
            by_pipe.setdefault(rep.pipeline, []).append(rep)
        for pipeline, reps in by_pipe.items():
            wanted = {g for p in waiting - {pipeline} for g in self.homes[p]}
            if len(reps) > 1 and all(r.live == 1 and r.queued == 0 for r in reps):
                src = tuple(r.replica for r in reps if set(r.gpus) & wanted)
                dst = tuple(r.replica for r in reps if not set(r.gpus) & wanted)
                if src and dst:
                    actions.append(Migrate(pipeline, src, dst))
        for r in snap.ready:
            if snap.free_gpus:
                actions.append(StartStage(r.pipeline, r.step, r.stage, tuple(sorted(snap.free_gpus))))
        return SchedulerOutput(tuple(actions))


def test_a_planned_migration_is_ordered_then_frees_the_sources_slots_for_the_waiting_stage():
    homes = {"a": (0, 1), "b": (0,)}
    ex = LiveExecutor(2, CPU_SLOT, lambda workload: _MigrateForTheWaiting(homes), policy_name="test")
    ex.join(_spec("a"), 2, 0.0)
    ex.join(_spec("b"), 1, 0.0)
    assert (ex.home("a"), ex.home("b")) == (homes["a"], homes["b"])
    assert [g.gpus for g in ex.request("a", 0, "rollout", 0.0)] == [(0, 1)]
    assert ex.request("b", 0, "rollout", 0.5) == []  # its home (slot 0) is a's
    busy = [ReplicaReport(0, 3, 0, 300, 200), ReplicaReport(1, 2, 0, 250, 150)]
    assert ex.report_replicas("a", 0, busy, 1.0) == ([], [])  # not in the tail: no order
    tail = [ReplicaReport(0, 1, 0, 120, 90), ReplicaReport(1, 1, 0, 100, 70)]
    grants, orders = ex.report_replicas("a", 0, tail, 2.0)
    assert grants == [] and orders == [MigrationOrder("a", 0, sources=(0,), targets=(1,))]
    # ordered once; the source stays leased until the pipeline says the move is done
    assert ex.report_replicas("a", 0, tail[1:], 2.5) == ([], [])
    assert ex.free_slots() == []
    grants = ex.migrated("a", 0, (0,), 3.0)
    assert [(g.pipeline, g.stage, g.gpus) for g in grants] == [("b", "rollout", (0,))]
    assert ex.pipes["a"].running[(0, "rollout")].gpus == (1,)
    # a's rollout finishes on its remaining replica; its history keeps the granted width and the live curve
    ex.finish("a", 0, "rollout", 6.0, finish_offsets_s=(5.0, 1.0, 2.0))
    timing = [h for h in ex.history if h.pipeline == "a"][0]
    assert (timing.gpus, timing.finish_offsets_s, timing.start_s, timing.end_s) == (2, (1.0, 2.0, 5.0), 0.0, 6.0)
    freed = [s for s in ex.slices if s.pipeline == "a" and s.gpus == (0,)]
    assert [(s.start_s, s.end_s) for s in freed] == [(0.0, 3.0)]
    _check_leases(ex)
    assert not ex.policy_errors


def _trainer_order(steps: int, validate_at: tuple[int, ...] = ()) -> list[tuple[str, int, str]]:
    """The leases of trainer mode ``jigsaw`` in its order: start-up, then per step the previous step's sync handing
    over to the rollout, log-prob, update; a validation after step k (-1: before training)."""
    order = [("begin", -1, "init")]
    order += [("begin", -1, "validate")] if -1 in validate_at else []
    for k in range(steps):
        order += [("begin", k - 1, "weight_sync"), ("handover", k, "rollout"), ("begin", k, "logprob")]
        order += [("begin", k, "update")] + ([("begin", k, "validate")] if k in validate_at else [])
    return order


def _run_trainer_order(ex: LiveExecutor, names: list[str], steps: int, validate_at=()) -> dict[str, float]:
    """Each pipeline walks :func:`_trainer_order` (a lease lasts 1 s, a rollout 3 s); a handover must be granted
    at once; returns the finish times."""
    todo = {n: _trainer_order(steps, validate_at) for n in names}
    running: dict[str, tuple[float, int, str]] = {}
    finished, now = {}, 0.0

    def start(grants):
        for g in grants:
            assert g.pipeline not in running, "two leases of one pipeline at once"
            running[g.pipeline] = (now + DURATION.get(g.stage, 1.0), g.step, g.stage)

    for n in names:
        start(ex.request(n, *todo[n].pop(0)[1:], now))
    while running:
        name, (end, step, stage) = min(running.items(), key=lambda kv: (kv[1][0], kv[0]))
        now = end
        del running[name]
        if todo[name] and todo[name][0][0] == "handover":
            _, next_step, next_stage = todo[name].pop(0)
            grants = ex.handover(name, step, stage, next_step, next_stage, now)
            assert grants and grants[0].pipeline == name and grants[0].stage == next_stage, grants
            start(grants)
            continue
        start(ex.finish(name, step, stage, now))
        if todo[name]:
            start(ex.request(name, *todo[name].pop(0)[1:], now))
        else:
            finished[name] = now
            start(ex.leave(name, now))
    return finished


@pytest.mark.parametrize("policy", ["jigsaw", "greedy"])
def test_engine_leases_are_contiguous_and_leases_outside_the_graph_run_alone(policy):
    """In the trainer's order (start-up, sync handing over to the rollout, validations): each pipeline's engines
    are awake over one unbroken stretch of leases from each sync to the end of its rollout, on the same slots;
    start-up and validation leases never share a slot with another pipeline's lease; only graph stages reach the
    history the predictor learns from, and the policy decides every graph stage and the first sync (as the head of
    the first rollout)."""
    ex = _executor(2, policy)
    for n in ("a", "b"):
        ex.join(_spec(n), 2, 0.0)
    assert sorted(_run_trainer_order(ex, ["a", "b"], 3, validate_at=(-1, 1))) == ["a", "b"]
    _check_leases(ex)
    assert not ex.policy_errors
    for n in ("a", "b"):
        mine = sorted((s for s in ex.slices if s.pipeline == n), key=lambda s: (s.start_s, s.stage))
        for k in range(3):
            sync = [s for s in mine if (s.step, s.stage) == (k - 1, WEIGHT_SYNC)]
            rollout = [s for s in mine if (s.step, s.stage) == (k, "rollout")]
            assert max(s.end_s for s in sync) == min(s.start_s for s in rollout), (n, k)
            assert {g for s in sync for g in s.gpus} == {g for s in rollout for g in s.gpus} == {0, 1}
        forced = {(s.step, s.stage) for s in mine if s.forced}
        assert forced == {(-1, "init"), (-1, "validate"), (1, "validate")}, forced
    for s in ex.slices:
        if s.stage in ("init", "validate"):
            others = [o for o in ex.slices if o.pipeline != s.pipeline and set(o.gpus) & set(s.gpus)]
            assert all(o.end_s <= s.start_s or o.start_s >= s.end_s for o in others), (s, others)
    graph = {(k, st) for k in range(3) for st in STAGES} - {(2, WEIGHT_SYNC)}  # no sync after the last step
    assert {(h.step, h.stage) for h in ex.history if h.pipeline == "a"} == graph


def test_a_handover_of_a_lease_not_held_or_while_waiting_is_refused():
    ex = _executor(2)
    ex.join(_spec("a"), 2, 0.0)
    with pytest.raises(ValueError, match="hands over weight_sync of step 0, which was not granted"):
        ex.handover("a", 0, WEIGHT_SYNC, 1, "rollout", 0.0)
    assert ex.request("a", -1, "init", 0.0)[0].forced
    with pytest.raises(ValueError, match="unknown stage 'warmup'"):
        ex.request("a", -1, "warmup", 0.0)


class _ShareEverything:
    """A test policy (the unit under test is the executor's admission, not a policy's judgement): every ready stage
    starts at once at half the SMs, beside whatever holds its slots."""

    name = config = "test-share-everything"

    def mode(self, pipeline):
        return ExecutionMode()

    def schedule(self, snap):
        gpus = tuple(range(snap.num_gpus))
        return SchedulerOutput(tuple(StartStage(r.pipeline, r.step, r.stage, gpus, 0.5) for r in snap.ready))


def test_a_weight_sync_and_another_pipelines_rollout_never_share_a_slot():
    """A sync hands its slots over to its own rollout (a rollout only ever starts that way): no sync is granted
    beside another pipeline's rollout, however the policy asks, so the two never share a slot (the simulator's
    schedule checks hold every policy to the same rule)."""
    ex = LiveExecutor(2, CPU_SLOT, lambda workload: _ShareEverything(), policy_name="test-share-everything")
    for n in "ab":
        ex.join(_spec(n), 2, 0.0)
    assert ex.home("a") == ex.home("b") == (0, 1)
    assert sorted(_run(ex, ["a", "b"])) == ["a", "b"]
    syncs = [s for s in ex.slices if s.stage == WEIGHT_SYNC and s.end_s > s.start_s]
    rollouts = [s for s in ex.slices if s.stage == "rollout" and s.end_s > s.start_s]
    assert syncs and rollouts
    shared = [
        (s.pipeline, s.step, r.pipeline, r.step)
        for s in syncs
        for r in rollouts
        if r.pipeline != s.pipeline and set(r.gpus) & set(s.gpus) and r.start_s < s.end_s and s.start_s < r.end_s
    ]
    assert shared == []
    assert any(s.sm_share < 1.0 for s in ex.slices), "nothing was co-located: the test would prove nothing"
    _check_leases(ex)


def test_verl_seq_keeps_the_pool_for_its_running_job_while_it_is_between_two_stages():
    """``verl-seq`` live: the job that runs keeps the pool while it is between two stages (a real trainer computes
    rewards and advantages outside leases), and the other starts when it has left, as in the simulator. A grant
    forced whenever nothing ran would start ``b`` in ``a``'s first gap."""
    ex = _executor(2, "verl-seq")
    for n in ("a", "b"):
        ex.join(_spec(n, steps=2), 2, 0.0)
    order = [(k, s) for k in range(2) for s in STAGES][:-1]  # the sync after the last step is outside the graph
    now = 0.0
    # b's first sync (the head of its first rollout) waits for a as well
    assert ex.request("b", -1, WEIGHT_SYNC, now) == []
    assert [g.pipeline for g in ex.request("a", *order[0], now)] == ["a"]
    for i, (k, stage) in enumerate(order[:-1]):
        now += 1.0
        assert ex.finish("a", k, stage, now) == []  # b waits through a's gap
        now += 0.5
        assert [g.pipeline for g in ex.request("a", *order[i + 1], now)] == ["a"]
    # a's last step done: the pool is b's (by the policy, not forced)
    grants = ex.finish("a", *order[-1], now + 1.0)
    assert [(g.pipeline, g.step, g.stage, g.forced) for g in grants] == [("b", -1, WEIGHT_SYNC, False)]
    assert not ex.policy_errors


def test_verl_split_runs_each_pipeline_on_its_home_whatever_order_they_joined_in():
    """The policy's workload lists the pipelines in pool order, so ``verl-split``'s slices are their homes: ``b``,
    joining first but homed on slot 1, is not held back while ``a`` (slot 0) runs."""
    ex = LiveExecutor(2, CPU_SLOT, live_policy_factory("verl-split"), policy_name="verl-split")
    ex.plan_homes({"a": (0,), "b": (1,)})
    for n in ("b", "a"):
        ex.join(_spec(n), 1, 0.0)
    assert [g.gpus for g in ex.request("a", 0, "rollout", 0.0)] == [(0,)]
    assert [g.gpus for g in ex.request("b", 0, "rollout", 0.5)] == [(1,)]
    assert not ex.policy_errors
