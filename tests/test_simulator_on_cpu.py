"""Every baseline produces a valid, deterministic schedule; the registry says what each policy needs."""

from __future__ import annotations

import pytest
from conftest import tiny_pipeline, tiny_workload_dict
from schedule_checks import check_all

from jigsaw_verl.model.spec import workload_from_dict
from jigsaw_verl.policy.interface import EXECUTION_FEATURES, Migrate, SchedulerOutput, features_of
from jigsaw_verl.policy.registry import BASELINES, POLICIES, policies_needing_at_most
from jigsaw_verl.sim.simulator import Simulator
from jigsaw_verl.sim.split_search import fastest_split_pruned

WORKLOADS = {
    "two-sync": tiny_workload_dict(),
    "async-late-arrival": tiny_workload_dict(
        num_gpus=6,
        pipelines=[
            tiny_pipeline("s"),
            tiny_pipeline("x", mode="async", max_staleness=2, steps=4),
            tiny_pipeline("late", arrival_s=3.0, rollout_tp=2),
        ],
    ),
}


def configurations(name, w):
    """Policy ``name``'s configurations on ``w``, built as the runner builds them."""
    return POLICIES.get(name).build(w, split_search=fastest_split_pruned)


@pytest.mark.parametrize("policy", BASELINES)
@pytest.mark.parametrize("wname", sorted(WORKLOADS))
def test_every_configuration_is_valid(policy, wname):
    w = workload_from_dict(WORKLOADS[wname], wname)
    configs = configurations(policy, w)
    assert configs or policy == "verl-split"
    for c in configs:
        check_all(w, Simulator(w, c).run())


def test_deterministic():
    w = workload_from_dict(WORKLOADS["async-late-arrival"])
    for policy in ("areal", "rollmux", "streamrl"):
        (c, *_) = configurations(policy, w)
        a, b = Simulator(w, c).run(), Simulator(w, c).run()
        assert a.makespan_s == b.makespan_s and a.slices == b.slices and a.stages == b.stages


def test_verl_seq_runs_jobs_one_after_another(tiny_workload):
    (c,) = configurations("verl-seq", tiny_workload)
    r = Simulator(tiny_workload, c).run()
    assert min(s.start_s for s in r.stages if s.pipeline == "b") >= r.finish_s["a"]
    assert all(len(s.gpus) == tiny_workload.cluster.num_gpus or s.stage == "rollout" for s in r.slices)


@pytest.mark.parametrize("policy", ["verl-split", "greedy"])
def test_finished_pipelines_release_device_memory(policy):
    """A finished job's state leaves the GPUs (it would otherwise shrink later replicas' KV caches)."""
    w = workload_from_dict(WORKLOADS["async-late-arrival"])
    sim = Simulator(w, configurations(policy, w)[0])
    sim.run()
    assert not any(sim.memory.resident)


def test_every_entry_declares_the_features_its_configurations_use():
    """On sync pipelines each configuration uses exactly what its entry needs (jigsaw's bounded staleness only
    applies to pipelines declared async)."""
    w = workload_from_dict(WORKLOADS["two-sync"], "two-sync")
    for name in POLICIES.names():
        entry = POLICIES.get(name)
        assert entry.name == name and entry.description and entry.needs <= set(EXECUTION_FEATURES)
        for c in configurations(name, w):
            assert all(features_of(c.mode(p.name)) == entry.needs for p in w.pipelines), name


def test_policies_needing_at_most():
    everything = POLICIES.names()
    assert policies_needing_at_most(frozenset(EXECUTION_FEATURES)) == everything
    assert policies_needing_at_most(frozenset()) == [n for n in everything if n not in ("streamrl", "areal")]
    assert "streamrl" in policies_needing_at_most(frozenset({"staleness", "streaming"}))
    assert "areal" not in policies_needing_at_most(frozenset({"staleness", "streaming", "overlapping"}))


def test_split_searching_policies_are_built_only_with_a_split_search():
    w = workload_from_dict(WORKLOADS["two-sync"], "two-sync")
    for name in ("streamrl", "areal"):
        with pytest.raises(ValueError, match=f"policy '{name}' picks its rollout/training split by simulation"):
            POLICIES.get(name).build(w)
    with pytest.raises(KeyError, match="unknown policy 'nope'; known: areal, greedy"):
        POLICIES.get("nope")


def test_a_policy_that_acts_only_on_ready_stages_is_not_asked_without_any():
    """The look-ahead's decision is empty when nothing is ready (unless a tail may move onto a wider replica), so
    it says ``acts_only_on_ready`` and the simulator asks it only when something is: the same schedule, without
    building a detailed snapshot for every finished request. Elastic pipelines keep every decision."""
    from jigsaw_verl.policy.jigsaw.knobs import JigsawKnobs
    from jigsaw_verl.policy.jigsaw.lookahead import LookAheadPolicy

    w = workload_from_dict(tiny_workload_dict(), "t")
    asked: list[int] = []
    results = []
    for silent in (True, False):
        policy = LookAheadPolicy(w, JigsawKnobs(), name="jigsaw")
        assert policy.acts_only_on_ready
        policy.acts_only_on_ready = silent
        inner = policy.schedule
        idle = []

        def schedule(snap, inner=inner, idle=idle):
            idle.append(not snap.ready)
            return inner(snap)

        policy.schedule = schedule
        results.append(Simulator(w, policy).run())
        asked.append(sum(idle))
    assert asked[0] == 0 < asked[1]
    assert results[0].slices == results[1].slices
    elastic = tiny_workload_dict(pipelines=[tiny_pipeline("a", rollout_elastic_tp=2), tiny_pipeline("b")])
    assert not LookAheadPolicy(workload_from_dict(elastic, "e"), JigsawKnobs(), name="jigsaw").acts_only_on_ready


class _FreeIdleReplicas:
    """Greedy on one pipeline that records, at every decision during its rollouts, whether the GPUs of its idle
    replicas (nothing live or queued) are free; with ``release`` it names them the sources of a ``Migrate`` onto a
    busy replica of the same rollout (as the jigsaw policy may) and records whether their GPUs are free after."""

    detailed_snapshot = True

    def __init__(self, w, release: bool):
        (self.inner,) = configurations("greedy", w)
        self.name, self.config, self.release = "idle-probe", "test", release
        self.idle_free: list[bool] = []  # per decision with idle and busy replicas: their GPUs free
        self.freed_free: list[bool] = []  # per decision after a release, while the rollout runs: those GPUs free
        self.freed: set[int] = set()

    def mode(self, pipeline):
        return self.inner.mode(pipeline)

    def schedule(self, snap):
        busy = [r for r in snap.replicas if r.live > 0]
        if not busy:
            self.freed = set()
            return self.inner.schedule(snap)
        if self.freed:
            self.freed_free.append(self.freed <= set(snap.free_gpus))
        idle = [r for r in snap.replicas if r.live == 0 and r.queued == 0]
        if idle:
            self.idle_free.append(all(g in snap.free_gpus for r in idle for g in r.gpus))
            if self.release:
                self.freed |= {g for r in idle for g in r.gpus}
                sources = tuple(r.replica for r in idle)
                return SchedulerOutput((Migrate(busy[0].pipeline, sources, (busy[0].replica,)),))
        return self.inner.schedule(snap)


def test_a_hybrid_rollouts_idle_replica_holds_its_gpus_until_the_rollout_ends_or_a_migrate_frees_it():
    """verl wakes a sync pipeline's rollout engines at its weight sync and sleeps them together (the live
    executor's rollout lease holds every replica's slots): a replica that has finished its requests keeps its GPUs
    while the others decode, and only a ``Migrate`` that names it (the live migrator sleeps it) frees them early."""
    w = workload_from_dict(
        tiny_workload_dict(num_gpus=4, pipelines=[tiny_pipeline("a", batch_prompts=8, steps=2)]), "one-sync"
    )
    held = _FreeIdleReplicas(w, release=False)
    check_all(w, Simulator(w, held).run())
    assert held.idle_free and not any(held.idle_free)  # seen idle, and still held

    freed = _FreeIdleReplicas(w, release=True)
    r = Simulator(w, freed).run()
    check_all(w, r)
    assert r.migrations and all(m.requests == 0 for m in r.migrations)  # nothing to move, GPUs to free
    assert freed.freed_free and all(freed.freed_free)
