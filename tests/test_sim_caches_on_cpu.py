"""The simulator's kept-until-changed state (free memory, training homes, replica views, ready stages, free slots,
co-location speeds) equals what a fresh computation gives, at every decision of runs that co-locate, migrate, move
tails onto wider replicas and overlap async rollouts. The golden record checks bit-identity on the bundled
workloads; this checks the caches themselves, each against a from-scratch reference written out here."""

from __future__ import annotations

import dataclasses

from jigsaw_verl.model.memory import usable_bytes
from jigsaw_verl.model.workload_file import BUNDLED_DIR, load_workload
from jigsaw_verl.policy.interface import ReadyStage, ReplicaView
from jigsaw_verl.policy.jigsaw.knobs import JigsawKnobs
from jigsaw_verl.policy.jigsaw.lookahead import LookAheadPolicy
from jigsaw_verl.sim.simulator import Simulator
from jigsaw_verl.sim.tasks import Engine


def fresh_free_bytes(sim: Simulator) -> tuple[float, ...]:
    """Free memory per GPU summed from scratch: the replicas' live KV, then pinned resident state."""
    mem, used = sim.memory, [0.0] * sim.n
    pinned = {h.owner.key for g in range(sim.n) for h in sim.holds.on(g) if h.owner.key is not None}
    for h in {id(h): h for g in range(sim.n) for h in sim.holds.on(g)}.values():
        if isinstance(h.owner, Engine):
            e = h.owner.engine
            for g in h.slots:
                used[g] += e.kv_reserved * e.model.kv_bytes_per_token / e.tp
    for g, res in enumerate(mem.resident):
        for k, b in res.items():
            if k in pinned:
                used[g] += b
    return tuple(usable_bytes(mem.gpu) - u for u in used)


def fresh_rate(sim: Simulator, task) -> float:
    rate = 1.0
    for g in task.gpus:
        held = sim.holds.on(g)
        if len(held) == 2:
            a, b = (h.owner for h in held)
            rates = sim.cost.colocated_rates(sim._load(a, g), sim._load(b, g))
            rate = min(rate, rates[0] if a is task else rates[1])
    return rate


def check_every_decision(w) -> dict[str, int]:
    """Run jigsaw on ``w``, comparing every cached figure with its fresh value at each decision; returns what the
    run did (so the test knows the paths it covered)."""
    policy = LookAheadPolicy(w, JigsawKnobs(), name="jigsaw")
    sim = Simulator(w, policy)
    inner, seen = policy.schedule, {"decisions": 0, "shared_gpu_decisions": 0}

    def checked(snap):
        seen["decisions"] += 1
        assert snap.free_bytes == fresh_free_bytes(sim)
        homes = {}
        for res in sim.memory.resident:
            for k in res:
                if k[1] == "train":
                    homes.setdefault(k[0], k[2])
        assert {p.name: p.train_gpus for p in snap.pipelines if p.train_gpus} == homes
        assert snap.replicas == tuple(
            ReplicaView(
                replica=e.worker,
                pipeline=e.pipeline,
                step=e.step,
                gpus=e.gpus,
                live=len(e.engine.live),
                queued=len(e.engine.queue),
                context_tokens=int(sum(s.req.prompt_len + s.generated for s in e.engine.live)),
                generated_tokens=sum(s.generated for s in e.engine.live),
                started_s=e.started_s,
            )
            for e in sim.engines
        )
        assert snap.ready == tuple(
            ReadyStage(ps.spec.name, k, s) for ps in sim.pipes.values() for k, s in ps.progress.ready(ps.mode)
        )
        assert snap.free_gpus == frozenset(g for g in range(sim.n) if not sim.holds.on(g))
        tasks = {id(h.owner): h.owner for g in range(sim.n) for h in sim.holds.on(g)}.values()
        for t in tasks:
            assert sim._rate(t) == fresh_rate(sim, t)
        if any(len(sim.holds.on(g)) == 2 for g in range(sim.n)):
            seen["shared_gpu_decisions"] += 1
        return inner(snap)

    policy.schedule = checked
    result = sim.run()
    seen["migrations"] = len(result.migrations)
    seen["tail_moves"] = sum(1 for m in result.migrations if m.wide_tp)
    return seen


def test_cached_figures_equal_fresh_ones_with_colocation_migration_and_async_rollouts():
    seen = check_every_decision(load_workload(BUNDLED_DIR / "hetero-mixed-16xa100.yaml"))
    assert seen["decisions"] > 100 and seen["shared_gpu_decisions"] > 0 and seen["migrations"] > 0


def test_cached_figures_equal_fresh_ones_with_tail_moves():
    w = load_workload(BUNDLED_DIR / "longcot-qwen3-4b-x2-8xh100.yaml")
    w = dataclasses.replace(w, pipelines=tuple(dataclasses.replace(p, rollout_elastic_tp=4) for p in w.pipelines))
    seen = check_every_decision(w)
    assert seen["tail_moves"] > 0
