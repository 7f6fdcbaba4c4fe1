"""The rollout half of the simulator: starting replicas, their events, streaming samples, migrations.

:class:`ReplicaRunner` is the base of :class:`~jigsaw_verl.sim.simulator.Simulator` (one class over two files,
so each reads in one sitting): it uses the simulator's clock, holds, memory and event plumbing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from jigsaw_verl.model.graph import (
    ROLLOUT,
    SubStage,
    activity_node,
    assign_least_loaded,
    logprob_nodes,
    micro_batches,
    step_requests,
)
from jigsaw_verl.model.lengths import StepSamples
from jigsaw_verl.model.memory import rollout_weight_bytes
from jigsaw_verl.model.rollout_engine import ReplicaEngine
from jigsaw_verl.model.spec import PipelineSpec
from jigsaw_verl.model.topology import replica_groups
from jigsaw_verl.policy.interface import ExecutionMode, Migrate, WidenTail
from jigsaw_verl.pool.progress import PipelineProgress
from jigsaw_verl.pool.timeline import MigrationRecord, Slice
from jigsaw_verl.sim.device_memory import OutOfDeviceMemory
from jigsaw_verl.sim.tasks import EPS, Engine, Task


class SimulationError(RuntimeError):
    """The policy asked for something the pool cannot do, or stopped scheduling with work left."""


@dataclass(eq=False)
class SimPipe:
    """One simulated pipeline: its progress (the pool's record) and what only the simulator tracks."""

    spec: PipelineSpec
    mode: ExecutionMode
    samples: tuple[StepSamples, ...]
    progress: PipelineProgress
    remaining: dict = field(default_factory=dict)  # step -> responses not yet finished
    generated: list = field(default_factory=list)
    completions: list = field(default_factory=list)
    stream: dict = field(default_factory=dict)  # step -> (Gang, pending [(seq_len, done_s)], next mb index)
    finish_offsets: dict = field(default_factory=dict)  # step -> [finish times]
    last_rollout_gpus: int = 0
    ready_cache: tuple | None = None  # ((progress changes, arrived), its ready stages) (Simulator._ready)

    @classmethod
    def of(cls, spec: PipelineSpec, index: int, mode: ExecutionMode, samples: tuple[StepSamples, ...]) -> SimPipe:
        n, steps = spec.samples_per_step, spec.steps
        return cls(
            spec=spec,
            mode=mode,
            samples=samples,
            progress=PipelineProgress(name=spec.name, index=index, steps=steps, arrival_s=spec.arrival_s),
            generated=[np.zeros(n, np.int64) for _ in range(steps)],
            completions=[np.zeros(n, np.int64) for _ in range(steps)],
        )


class ReplicaRunner:
    """Rollout replicas of the simulator (see the module docstring)."""

    def _start_rollout(self, ps: SimPipe, step: int, gpus: tuple[int, ...], share: float = 1.0) -> None:
        spec, tp = ps.spec, ps.spec.rollout_tp
        joined = [e for e in self.engines if e.pipeline == spec.name and set(e.gpus) <= set(gpus)]
        fresh = [g for g in gpus if not any(g in e.gpus for e in joined)]
        if joined and not ps.mode.overlap_rollouts:
            raise SimulationError(
                f"{self.policy.name}: {spec.name} rollout {step} joins live replicas in a mode without overlap"
            )
        try:  # the pool's rule: a replica's TP group on one node (jigsaw_verl.model.topology)
            groups = replica_groups(fresh, tp, self.holds.topology)
        except ValueError as err:
            raise SimulationError(f"{self.policy.name}: rollout of {spec.name}: {err}") from None
        engines = list(joined)
        if share < 1.0:  # joining a gang: idle state of others makes room for the KV cache first
            self.memory.evict_idle_of_others(fresh, spec.name)
        longest = max(r.prompt_len + r.response_len for r in step_requests(ps.samples[step]))
        for group in groups:
            engines.append(self._new_replica(ps, step, group, share, longest))
        reqs = step_requests(ps.samples[step])
        ps.remaining[step] = len(reqs)
        ps.finish_offsets[step] = []
        for e in joined:
            e.step = step
        ps.last_rollout_gpus = len(gpus)
        for eng, part in zip(engines, assign_least_loaded(reqs, [e.engine.outstanding for e in engines])):
            if part:
                eng.engine.submit(part, self._local(eng))
            if eng.engine.busy:
                self._arm(eng)
            else:  # more replicas than requests: this one has nothing to do
                self._retire(eng)

    def _new_replica(
        self,
        ps: SimPipe,
        step: int,
        group: tuple[int, ...],
        share: float,
        longest: int,
        tp: int | None = None,
        load_s: float = 0.0,
    ) -> Engine:
        """A replica of ``tp`` GPUs (the pipeline's ``rollout_tp`` by default) that first loads its weights for
        at least ``load_s`` seconds (host copies of whatever was not resident otherwise)."""
        spec, tp = ps.spec, tp or ps.spec.rollout_tp
        key = (spec.name, "rollout", group)
        load_s = max(load_s, self.memory.make_resident(group, key, rollout_weight_bytes(spec.model) / tp))
        cap = self.memory.kv_for_replica(spec.model, tp, group, key, longest, spec.gpu_memory_utilization)
        eng = Engine(
            group,
            pipeline=spec.name,
            step=step,
            worker=self._next_replica,
            engine=ReplicaEngine(self.cost, spec.model, tp, cap),
            key=key,
            started_s=self.now,
        )
        self._next_replica += 1
        self._claim(group, eng, f"{spec.name} rollout {step}", share)
        if load_s > 0:
            eng.engine.load_weights(self.now, load_s, interrupt=False)
        self.engines.append(eng)
        return eng

    def _shrink_kv(self, gpus: tuple[int, ...]) -> None:
        """A sub-stage joined replicas' GPUs: their KV cache keeps what it holds and loses the rest."""
        for e in {t for g in gpus for t in self._tasks(g) if isinstance(t, Engine)}:
            room = self.memory.kv_room(e.engine.model, e.engine.tp, e.gpus, e.key)
            e.engine.kv_capacity = max(e.engine.kv_reserved, min(e.engine.kv_capacity, room))

    # ---- recording -------------------------------------------------------------------------------------------
    def _record(self, task: Task, node: SubStage, start: float, end: float, ready: float | None = None) -> None:
        if end > start:
            shares = tuple(task.hold.low[g] for g in task.gpus)  # the share it had throughout the slice
            shares = () if all(x == 1.0 for x in shares) else shares
            self.slices.append(
                Slice(
                    task.gpus,
                    start,
                    end,
                    node.pipeline,
                    node.step,
                    node.stage,
                    node.name,
                    node.bound,
                    node.flops,
                    ready,
                    shares,
                )
            )

    def _record_acts(self, e: Engine, acts) -> None:
        ps = self.pipes[e.pipeline]
        for a in acts:
            node = activity_node(ps.spec, e.step, e.worker, a, 0.0)
            self._record(e, node, e.to_sim(a.start_s), e.to_sim(a.end_s))
        if acts:
            e.hold.mark()

    # ---- replica events --------------------------------------------------------------------------------------
    def _on_engine(self, e: Engine) -> None:
        # NOTE: the event is due. A slowed-down engine advances to its own event time, so float rounding of its
        # local clock can never leave the event pending; a never-slowed one sees the simulator's clock, or its own
        # event time where that is up to EPS later (the heap pops events within EPS of now: advancing to now alone
        # would leave such an event pending and re-armed at the same moment, for ever).
        sim, local, rate = e.marks[-1]
        exact = sim == local and rate == 1.0
        due = e.engine.next_event_s()
        if exact:
            target = self.now if due is None else max(self.now, min(due, self.now + EPS))
        else:
            target = max(self._local(e), due)
        done, acts = e.engine.advance(target)
        ps = self.pipes[e.pipeline]
        self._record_acts(e, acts)
        for req, t, generated in done:
            self._sample_done(ps, req.step, req.index, generated, e.to_sim(t))
        if e.engine.busy:
            self._arm(e)
            if self._shared(e):
                self._rerate(e.gpus)
        else:
            self._retire(e)

    def _retire(self, e: Engine, *, park: bool = True) -> None:
        """A replica with nothing left to generate frees its GPUs (its weights stay resident), except one of a
        hybrid-engine pipeline (``colocated``) whose rollout still runs: verl wakes a rollout's engines at its weight
        sync and sleeps them together when the rollout ends, so the idle replica keeps its GPUs and KV cache (the
        live executor's rollout lease holds its slots) until then, or until a ``Migrate`` names it a source (the
        migrator sleeps the sources it empties). ``park=False``: free it now."""
        ps = self.pipes[e.pipeline]
        if e not in self.engines:
            return  # already freed with its rollout's other idle replicas
        if park and ps.mode.colocated and ps.remaining.get(e.step, 0) > 0:
            return  # idle, held: stays in the snapshot with nothing live
        self.reprefill_tokens += e.engine.reprefill_tokens
        e.token += 1  # an event still queued for it (a migrated source) is stale
        self.engines.remove(e)
        self._release(e)

    def _sample_done(self, ps: SimPipe, step: int, index: int, generated: int, t: float) -> None:
        ps.generated[step][index] += generated
        ps.completions[step][index] += 1
        ps.finish_offsets[step].append(t - ps.progress.started_s[(step, ROLLOUT)])
        ps.remaining[step] -= 1
        if step in ps.stream:
            s = ps.samples[step]
            ps.stream[step][1].append((int(s.prompt_len[index] + s.response_len[index]), t))
        if ps.remaining[step] == 0:
            for e in [e for e in self.engines if e.pipeline == ps.spec.name and e.step == step and not e.engine.busy]:
                self._retire(e, park=False)  # the rollout's engines sleep together
            self._stage_done(ps, step, ROLLOUT, t)
        if step in ps.stream:
            self._feed_stream(ps, step)

    def _feed_stream(self, ps: SimPipe, step: int) -> None:
        """Turn finished samples into log-prob micro-batches once a micro-batch's worth has arrived (or the
        rollout is over)."""
        gang, pending, j = ps.stream[step]
        budget = len(gang.gpus) * ps.spec.train_micro_batch_tokens
        over = ps.progress.done(step, ROLLOUT)
        while pending and (over or sum(n for n, _ in pending) >= budget):
            lens = np.array([n for n, _ in pending])
            take = len(micro_batches(lens, budget)[0])
            batch, pending[:] = pending[:take], pending[take:]
            ready = max(t for _, t in batch)
            for n in logprob_nodes(ps.spec, self.cost, step, len(gang.gpus), lens[:take], first_index=j):
                gang.nodes.append((n, ready))
            j += 1
        ps.stream[step][2] = j
        if over:
            gang.closed = True
            del ps.stream[step]
        if gang.current is None:
            self._next_node(gang)

    def _empty(self, sources: list[Engine]) -> tuple[list, float]:
        """Abort every request on ``sources`` and retire them: the requests with their tokens so far, and the
        GPU-seconds the sources would still have held (each one's longest remaining response at its current step
        time and rate)."""
        moved, freed = [], 0.0
        for e in sources:
            eng = e.engine
            remaining = max((s.req.response_len - s.generated for s in eng.live), default=0)
            step_s = self.cost.decode_step(eng.model, eng.tp, max(1, eng.live_count), eng.context_tokens)
            freed += remaining * step_s / max(e.rate, 1e-9) * len(e.gpus)
            reqs, acts = eng.abort(self._local(e))
            self._record_acts(e, acts)
            moved += reqs
            self._retire(e, park=False)
        return moved, freed

    def _migrate(self, m: Migrate) -> None:
        by_id = {e.worker: e for e in self.engines}
        ids = list(m.sources) + list(m.targets)
        if not m.sources or not m.targets or len(set(ids)) != len(ids) or any(i not in by_id for i in ids):
            raise SimulationError(f"{self.policy.name}: {m} names replicas that are not live, or repeats one")
        if any(by_id[i].pipeline != m.pipeline for i in ids):
            raise SimulationError(f"{self.policy.name}: {m} mixes pipelines")
        targets = [by_id[i] for i in m.targets]
        moved, freed = self._empty([by_id[i] for i in m.sources])
        for req, _ in moved:
            cap = min(t.engine.kv_capacity for t in targets)
            if req.prompt_len + req.response_len > cap:
                raise SimulationError(f"{self.policy.name}: {m}: a request does not fit the targets' KV cache")
        loads = [t.engine.outstanding for t in targets]
        for req, generated in moved:
            i = min(range(len(loads)), key=loads.__getitem__)
            loads[i] += 1
            targets[i].engine.resume(req, generated, self._local(targets[i]))
        for t in targets:
            self._arm(t)
            if self._shared(t):
                self._rerate(t.gpus)
        self.migrations.append(
            MigrationRecord(
                time_s=self.now,
                pipeline=m.pipeline,
                sources=tuple(g for i in m.sources for g in by_id[i].gpus),
                targets=tuple(g for t in targets for g in t.gpus),
                requests=len(moved),
                reprefill_tokens=sum(r.prompt_len + g for r, g in moved if g > 0),
                freed_gpu_s=freed,
            )
        )

    def _check_widen(self, w: WidenTail) -> list[Engine]:
        """The sources of ``w``, or a :class:`SimulationError` naming what the pool cannot do."""
        by_id = {e.worker: e for e in self.engines}
        ps = self.pipes.get(w.pipeline)
        if ps is None or not w.sources or len(set(w.sources)) != len(w.sources):
            raise SimulationError(f"{self.policy.name}: {w} names no pipeline or repeats a source")
        if any(i not in by_id or by_id[i].pipeline != w.pipeline for i in w.sources):
            raise SimulationError(f"{self.policy.name}: {w} names replicas that are not {w.pipeline}'s live ones")
        sources = [by_id[i] for i in w.sources]
        wide, gpn = len(w.gpus), self.cost.gpus_per_node
        limit = ps.spec.rollout_elastic_tp or ps.spec.rollout_tp
        if wide > limit or wide % ps.spec.rollout_tp or wide <= max(len(e.gpus) for e in sources):
            raise SimulationError(
                f"{self.policy.name}: {w}: a tail replica of TP {wide} is not wider than its sources within "
                f"{w.pipeline}'s rollout_elastic_tp ({limit})"
            )
        if len(set(w.gpus)) != wide or len({g // gpn for g in w.gpus}) != 1:
            raise SimulationError(f"{self.policy.name}: {w}: a replica's GPUs must be distinct and on one node")
        own = {g for e in sources for g in e.gpus}
        if any(g not in own and self.holds.on(g) for g in w.gpus) or any(len(self.holds.on(g)) > 1 for g in own):
            raise SimulationError(f"{self.policy.name}: {w}: its GPUs must be free or the sources' own, unshared")
        return sources

    def _widen(self, w: WidenTail) -> None:
        """Apply a :class:`WidenTail`: abort the sources, build the wide replica, resume every request on it."""
        sources = self._check_widen(w)
        ps = self.pipes[w.pipeline]
        step = max(e.step for e in sources)
        moved, freed = self._empty(sources)
        longest = max(r.prompt_len + r.response_len for r, _ in moved)
        gpus = tuple(sorted(w.gpus))
        try:
            # NOTE: weights resident from an earlier move are a version old: the wide engine always copies the
            # current ones in and wakes, whatever is resident (CostModel.tail_move_load).
            load_s = self.cost.tail_move_load(ps.spec.model, len(gpus))
            target = self._new_replica(ps, step, gpus, 1.0, longest, tp=len(gpus), load_s=load_s)
        except OutOfDeviceMemory as err:
            raise SimulationError(f"{self.policy.name}: {w}: {err}") from None
        for req, generated in moved:
            target.engine.resume(req, generated, self._local(target))
        self._arm(target)
        self.migrations.append(
            MigrationRecord(
                time_s=self.now,
                pipeline=w.pipeline,
                sources=tuple(g for e in sources for g in e.gpus),
                targets=gpus,
                requests=len(moved),
                reprefill_tokens=sum(r.prompt_len + g for r, g in moved if g > 0),
                freed_gpu_s=freed,
                wide_tp=len(gpus),
            )
        )
