"""A deterministic discrete-event simulator that executes a scheduling policy over a GPU pool.

Events are ordered by (time, priority, sequence number); the sequence counter belongs to the simulator
instance, so runs never leak into each other and the same workload, seed and policy always give the same result.
The loop is short: pop every event due now, let it advance its replica or gang task, then ask the policy what
to start (:meth:`Simulator._decide`). What runs:

- a rollout stage runs on replicas (:class:`~jigsaw_verl.model.rollout_engine.ReplicaEngine`), each freeing its
  GPUs as soon as it has nothing left to generate;
- every other stage runs as one *gang* over its GPUs, node by node (the nodes of :mod:`jigsaw_verl.model.graph`).

Co-location: a sub-stage started with an SM share below 1 may join a GPU held by one other sub-stage (whose
lease there shrinks to the rest). Two co-located sub-stages progress at the speeds
:meth:`CostModel.colocated_rates` gives for their current nodes; every task keeps a local clock (its progress)
that runs at its current rate, so when rates change the remaining work is rescaled. A task alone on its GPUs
runs at full speed whatever its lease. Migration (:class:`~jigsaw_verl.policy.interface.Migrate`) aborts the
requests of some replicas of a pipeline and resumes them on others, which re-prefill prompt + tokens so far.

Memory: each GPU keeps pipeline state resident (training state sharded over a GPU set, rollout weights per
replica) and evicts the least recently used idle state of another pipeline when it needs room; loading state
that is not resident costs a host-to-device copy at the cost model's PCIe rate, charged before the stage.
KV cache gets what resident state leaves free.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from dataclasses import dataclass, field

import numpy as np

from jigsaw_verl.model.cost_model import CostModel, Work
from jigsaw_verl.model.graph import (
    LOGPROB,
    ROLLOUT,
    STAGES,
    UPDATE,
    WEIGHT_SYNC,
    SubStage,
    activity_node,
    assign_least_loaded,
    logprob_nodes,
    micro_batches,
    step_requests,
    update_nodes,
    weight_sync_node,
)
from jigsaw_verl.model.lengths import StepSamples, sample_steps
from jigsaw_verl.model.memory import kv_capacity_tokens, rollout_weight_bytes, train_state_bytes, usable_bytes
from jigsaw_verl.model.rollout_engine import ReplicaEngine
from jigsaw_verl.model.spec import PipelineSpec, WorkloadSpec
from jigsaw_verl.policy.interface import (
    ExecutionMode,
    Lease,
    Migrate,
    PipelineView,
    Policy,
    ReadyStage,
    ReplicaView,
    SchedulerOutput,
    Snapshot,
    StageTiming,
    StartStage,
)

EPS = 1e-9
_ARRIVE, _TASK = 0, 1


class SimulationError(RuntimeError):
    """The policy asked for something the pool cannot do, or stopped scheduling with work left."""


@dataclass(frozen=True)
class Slice:
    """A sub-stage that ran on some GPUs.

    Attributes:
        gpus: GPU indices.
        start_s: begin, seconds.
        end_s: end, seconds.
        pipeline: pipeline name.
        step: step index.
        stage: stage name.
        name: sub-stage name.
        bound: ``compute`` | ``memory`` | ``comm`` | ``cpu`` | ``load``.
        flops: useful model FLOPs.
        inputs_ready_s: when the samples it consumes existed (streamed log-prob micro-batches), else ``None``.
        sm_shares: the smallest SM share leased on each of ``gpus`` over the slice (empty: 1 on each, exclusive).
    """

    gpus: tuple[int, ...]
    start_s: float
    end_s: float
    pipeline: str
    step: int
    stage: str
    name: str
    bound: str
    flops: float = 0.0
    inputs_ready_s: float | None = None
    sm_shares: tuple[float, ...] = ()


@dataclass(frozen=True)
class MigrationRecord:
    """One executed :class:`~jigsaw_verl.policy.interface.Migrate`.

    Attributes:
        time_s: when it happened, seconds.
        pipeline: pipeline name.
        sources: GPUs freed.
        targets: GPUs of the replicas that took the requests.
        requests: requests moved.
        reprefill_tokens: prompt + generated tokens the targets re-prefill.
        freed_gpu_s: GPU-seconds the sources would still have held without the migration (each source's
            longest remaining response decoded at its current step time), an estimate from the true lengths.
    """

    time_s: float
    pipeline: str
    sources: tuple[int, ...]
    targets: tuple[int, ...]
    requests: int
    reprefill_tokens: int
    freed_gpu_s: float


@dataclass(frozen=True)
class StageRecord:
    """When a stage of a step started and ended, and on how many GPUs it started."""

    pipeline: str
    step: int
    stage: str
    start_s: float
    end_s: float
    gpus: int = 0


@dataclass(frozen=True)
class SimResult:
    """Everything a run produced. Metrics are derived from it in :mod:`jigsaw_verl.sim.metrics`.

    Attributes:
        workload: workload name.
        policy: policy name.
        config: the configuration the policy fixed (split, order).
        num_gpus: pool size.
        makespan_s: when the last pipeline finished.
        finish_s: per pipeline, when its last update finished.
        slices: every sub-stage that ran.
        stages: every stage's start and end.
        generated: per pipeline, per step, tokens generated for each response (index order).
        completions: per pipeline, per step, how many times each response finished.
        reprefill_tokens: tokens re-prefilled after interrupts or migrations.
        staleness: per pipeline, the staleness the policy ran it with.
        migrations: every migration executed.
        rollout_finish_offsets: per pipeline, per step, when each response finished after the rollout began
            (the live-batch curve the predictor learns from), seconds.
    """

    workload: str
    policy: str
    config: str
    num_gpus: int
    makespan_s: float
    finish_s: dict[str, float]
    slices: tuple[Slice, ...]
    stages: tuple[StageRecord, ...]
    generated: dict[str, list[np.ndarray]]
    completions: dict[str, list[np.ndarray]]
    reprefill_tokens: int
    staleness: dict[str, int]
    migrations: tuple[MigrationRecord, ...] = ()
    rollout_finish_offsets: dict[str, list[tuple[float, ...]]] = field(default_factory=dict)


# ---- tasks ----------------------------------------------------------------------------------------------------
@dataclass(eq=False)
class _Task:
    """What every task has: a lease per GPU and a local clock (progress) running at ``rate`` since the last
    mark ``(sim_s, local_s, rate)``."""

    gpus: tuple[int, ...]
    shares: dict = field(default_factory=dict)  # gpu -> SM share
    low: dict = field(default_factory=dict)  # gpu -> smallest SM share since its last recorded slice
    rate: float = 1.0
    marks: list = field(default_factory=list)
    token: int = 0


@dataclass(eq=False)
class _Engine(_Task):
    pipeline: str = ""
    step: int = 0
    worker: int = 0
    engine: ReplicaEngine | None = None
    key: tuple = ()
    started_s: float = 0.0
    stage: str = ROLLOUT


@dataclass(eq=False)
class _Gang(_Task):
    pipeline: str = ""
    step: int = 0
    stage: str = ""
    nodes: deque = field(default_factory=deque)
    closed: bool = True
    key: tuple | None = None
    current: tuple | None = None  # (SubStage, local start, local end, inputs_ready, sim start)


@dataclass(eq=False)
class _Pipe:
    spec: PipelineSpec
    index: int
    mode: ExecutionMode
    samples: tuple[StepSamples, ...]
    arrived: bool = False
    finished: bool = False
    version: int = 0
    status: dict = field(default_factory=dict)  # (step, stage) -> "running" | "done"
    started: dict = field(default_factory=dict)
    next_rollout: int = 0
    remaining: dict = field(default_factory=dict)  # step -> responses not yet finished
    generated: list = field(default_factory=list)
    completions: list = field(default_factory=list)
    stream: dict = field(default_factory=dict)  # step -> (_Gang, pending [(seq_len, done_s)], next mb index)
    finish_offsets: dict = field(default_factory=dict)  # step -> [finish times]
    stage_gpus: dict = field(default_factory=dict)  # (step, stage) -> GPUs it started on
    last_rollout_gpus: int = 0
    finish_s: float = 0.0

    def done(self, step: int, stage: str) -> bool:
        return self.status.get((step, stage)) == "done"

    def begun(self, step: int, stage: str) -> bool:
        return (step, stage) in self.status


class Simulator:
    """Run ``policy`` over ``workload``.

    Args:
        workload: the pool and pipelines.
        policy: the scheduling policy (one configuration).
        cost: cost model; defaults to the workload GPU's with default efficiencies.
    """

    def __init__(self, workload: WorkloadSpec, policy: Policy, cost: CostModel | None = None):
        self.w = workload
        self.policy = policy
        self.cost = cost or CostModel(workload.cluster.gpu, gpus_per_node=workload.cluster.gpus_per_node)
        self.n = workload.cluster.num_gpus
        self.pipes = {
            p.name: _Pipe(p, i, policy.mode(p.name), sample_steps(p, workload.seed))
            for i, p in enumerate(workload.pipelines)
        }
        for ps in self.pipes.values():
            ps.generated = [np.zeros(ps.spec.samples_per_step, np.int64) for _ in range(ps.spec.steps)]
            ps.completions = [np.zeros(ps.spec.samples_per_step, np.int64) for _ in range(ps.spec.steps)]
        self.now = 0.0
        self._seq = 0
        self._heap: list = []
        self.occ: list[list[_Task]] = [[] for _ in range(self.n)]
        self.last: list[str | None] = [None] * self.n
        self.resident: list[OrderedDict] = [OrderedDict() for _ in range(self.n)]
        self.engines: list[_Engine] = []
        self.slices: list[Slice] = []
        self.stage_log: list[StageRecord] = []
        self.reprefill_tokens = 0
        self.migrations: list[MigrationRecord] = []
        self.history: list[StageTiming] = []
        self._next_replica = 0

    # ---- event plumbing --------------------------------------------------------------------------------------
    def _push(self, t: float, prio: int, item) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, prio, self._seq, item))

    def _arm(self, task) -> None:
        """(Re)schedule a task's next event; older heap entries for it become stale."""
        task.token += 1
        t = task.engine.next_event_s() if isinstance(task, _Engine) else (task.current[2] if task.current else None)
        if t is not None:
            self._push(self._to_sim(task, t), _TASK, (task, task.token))

    # ---- local clocks (progress under co-location) -----------------------------------------------------------
    def _local(self, task: _Task) -> float:
        sim, local, rate = task.marks[-1]
        if sim == local and rate == 1.0:  # NOTE: exact for tasks never slowed down (all baselines)
            return self.now
        return local + (self.now - sim) * rate

    def _to_sim(self, task: _Task, t_local: float) -> float:
        for sim, local, rate in reversed(task.marks):
            if t_local >= local or (sim, local, rate) == task.marks[0]:
                return t_local if sim == local and rate == 1.0 else sim + (t_local - local) / rate
        raise AssertionError("unreachable")

    def _load(self, task: _Task, g: int):
        if isinstance(task, _Engine):
            work, dur = task.engine.current_load()
            gpus = len(task.gpus)
        else:
            node = task.current[0] if task.current else None
            work, dur, gpus = (node.work, node.duration_s, len(task.gpus)) if node else (Work(), 0.0, 1)
        return self.cost.stage_load(work, dur, gpus, sm_share=task.shares[g], mem_share=0.0)

    def _rate(self, task: _Task) -> float:
        rate = 1.0
        for g in task.gpus:
            occ = self.occ[g]
            if len(occ) == 2:
                a, b = occ
                rates = self.cost.colocated_rates(self._load(a, g), self._load(b, g))
                if rates is None:
                    raise SimulationError(f"{self.policy.name}: SM shares on GPU {g} exceed 1")
                rate = min(rate, rates[0] if a is task else rates[1])
        return rate

    def _rerate(self, gpus) -> None:
        """Occupancy or a node changed on ``gpus``: give every task there its current speed."""
        tasks = []
        for g in gpus:
            tasks += [t for t in self.occ[g] if t not in tasks]
        for t in tasks:
            r = self._rate(t)
            if r != t.rate:
                t.marks.append((self.now, self._local(t), r))
                t.rate = r
                self._arm(t)

    def run(self) -> SimResult:
        """Simulate to the end and return the result record."""
        for ps in self.pipes.values():
            self._push(ps.spec.arrival_s, _ARRIVE, ps)
        while self._heap:
            self.now = self._heap[0][0]
            while self._heap and self._heap[0][0] <= self.now + EPS:
                _, _, _, item = heapq.heappop(self._heap)
                if isinstance(item, _Pipe):
                    item.arrived = True
                else:
                    task, token = item
                    if token == task.token:
                        self._on_engine(task) if isinstance(task, _Engine) else self._on_gang(task)
            self._decide()
        unfinished = [p for p, ps in self.pipes.items() if not ps.finished]
        if unfinished:
            raise SimulationError(
                f"policy {self.policy.name} ({self.policy.config}) stopped scheduling at t={self.now:.1f}s with "
                f"pipelines unfinished: {', '.join(unfinished)}"
            )
        return SimResult(
            workload=self.w.name,
            policy=self.policy.name,
            config=self.policy.config,
            num_gpus=self.n,
            makespan_s=max(ps.finish_s for ps in self.pipes.values()),
            finish_s={p: ps.finish_s for p, ps in self.pipes.items()},
            slices=tuple(self.slices),
            stages=tuple(self.stage_log),
            generated={p: ps.generated for p, ps in self.pipes.items()},
            completions={p: ps.completions for p, ps in self.pipes.items()},
            reprefill_tokens=self.reprefill_tokens + sum(e.engine.reprefill_tokens for e in self.engines),
            staleness={p: ps.mode.staleness for p, ps in self.pipes.items()},
            migrations=tuple(self.migrations),
            rollout_finish_offsets={
                p: [tuple(sorted(ps.finish_offsets.get(k, ()))) for k in range(ps.spec.steps)]
                for p, ps in self.pipes.items()
            },
        )

    # ---- decisions -------------------------------------------------------------------------------------------
    def _decide(self) -> None:
        for _ in range(1000):
            out: SchedulerOutput = self.policy.schedule(self.snapshot())
            if not out.actions:
                return
            for action in out.actions:
                self._migrate(action) if isinstance(action, Migrate) else self._start(action)
        raise SimulationError(f"policy {self.policy.name} kept starting stages at t={self.now:.3f}s without end")

    def snapshot(self) -> Snapshot:
        detailed = getattr(self.policy, "detailed_snapshot", False)
        ready: list[ReadyStage] = []
        views = []
        gangs: dict[str, list] = {}  # one pass over the pool, in GPU order
        for occ in self.occ:
            for g in occ:
                if isinstance(g, _Gang):
                    entries = gangs.setdefault(g.pipeline, [])
                    if (g.step, g.stage, g.gpus) not in entries:
                        entries.append((g.step, g.stage, g.gpus))
        by_pipe: dict[str, list] = {}
        for e in self.engines:
            by_pipe.setdefault(e.pipeline, []).append(e)
        homes = self._train_homes() if detailed else {}
        for ps in self.pipes.values():
            ready += [ReadyStage(ps.spec.name, k, s) for k, s in self._ready(ps)]
            running = list(gangs.get(ps.spec.name, ()))
            engines = by_pipe.get(ps.spec.name, [])
            if engines:
                running.append((-1, ROLLOUT, tuple(sorted(g for e in engines for g in e.gpus))))
            since = tuple(
                ps.started.get((st if st >= 0 else ps.next_rollout - 1, stage), self.now) for st, stage, _ in running
            )
            views.append(
                PipelineView(
                    name=ps.spec.name,
                    index=ps.index,
                    arrival_s=ps.spec.arrival_s,
                    arrived=ps.arrived,
                    started=bool(ps.status),
                    finished=ps.finished,
                    version=ps.version,
                    steps_done=sum(ps.done(k, UPDATE) for k in range(ps.spec.steps)),
                    running=tuple(running),
                    rollout_gpus=frozenset(g for e in engines for g in e.gpus),
                    running_since_s=since,
                    train_gpus=homes.get(ps.spec.name, ()),
                )
            )
        basic = dict(
            now_s=self.now,
            num_gpus=self.n,
            free_gpus=frozenset(i for i, o in enumerate(self.occ) if not o),
            ready=tuple(ready),
            pipelines=tuple(views),
            last_pipeline=tuple(self.last),
        )
        if not detailed:  # the baselines decide on the basic fields
            return Snapshot(**basic)
        cap, pinned = usable_bytes(self.w.cluster.gpu), self._pinned()
        return Snapshot(
            **basic,
            leases=tuple(
                tuple(
                    Lease(
                        pipeline=t.pipeline,
                        stage=t.stage,
                        sm_share=t.shares[g],
                        replica=t.worker if isinstance(t, _Engine) else None,
                    )
                    for t in occ
                )
                for g, occ in enumerate(self.occ)
            ),
            free_bytes=tuple(
                cap - sum(b for k, b in self.resident[g].items() if k in pinned) - self._kv_bytes(g)
                for g in range(self.n)
            ),
            replicas=tuple(
                ReplicaView(
                    replica=e.worker,
                    pipeline=e.pipeline,
                    step=e.step,
                    gpus=e.gpus,
                    live=e.engine.live_count,
                    queued=len(e.engine.queue),
                    context_tokens=e.engine.context_tokens,
                    generated_tokens=e.engine.live_generated,
                    started_s=e.started_s,
                )
                for e in self.engines
            ),
            history=tuple(self.history),
        )

    def _ready(self, ps: _Pipe) -> list[tuple[int, str]]:
        if not ps.arrived or ps.finished:
            return []
        out = []
        m, steps = ps.mode, ps.spec.steps
        k = ps.next_rollout
        if k < steps:
            prev_ok = k == 0 or ps.done(k - 1, ROLLOUT) or (m.overlap_rollouts and ps.begun(k - 1, ROLLOUT))
            if prev_ok and ps.version >= k - m.staleness:
                out.append((k, ROLLOUT))
        # NOTE: the training side (actor/critic/ref worker group) does one thing at a time, as in verl.
        if any(v == "running" and st != ROLLOUT for (_, st), v in ps.status.items()):
            return out
        for j in range(steps):
            if not ps.begun(j, LOGPROB):
                rolled = ps.done(j, ROLLOUT) or (m.stream_logprob and ps.begun(j, ROLLOUT))
                if rolled and (j == 0 or ps.done(j - 1, UPDATE)):
                    out.append((j, LOGPROB))
                break
        for j in range(steps):
            if not ps.begun(j, UPDATE):
                if ps.done(j, LOGPROB):
                    out.append((j, UPDATE))
                break
        for j in range(steps - 1):  # the last step publishes no weights: nothing rolls out after it
            if not ps.begun(j, WEIGHT_SYNC):
                if ps.done(j, UPDATE):
                    out.append((j, WEIGHT_SYNC))
                break
        # NOTE: step order first, so publishing step k's weights comes before step k+1's log-prob passes.
        return sorted(out, key=lambda s: (s[0], STAGES.index(s[1])))

    # ---- starting stages -------------------------------------------------------------------------------------
    def _start(self, a: StartStage) -> None:
        ps = self.pipes.get(a.pipeline)
        if ps is None or (a.step, a.stage) not in self._ready(ps):
            raise SimulationError(f"{self.policy.name}: {a} is not ready at t={self.now:.3f}s")
        gpus = tuple(sorted(set(a.gpus)))
        if not gpus or len(gpus) != len(a.gpus) or gpus[0] < 0 or gpus[-1] >= self.n:
            raise SimulationError(f"{self.policy.name}: {a} names invalid GPUs")
        if not 0.0 < a.sm_share <= 1.0:
            raise SimulationError(f"{self.policy.name}: {a} has an SM share outside (0, 1]")
        ps.status[(a.step, a.stage)] = "running"
        ps.started[(a.step, a.stage)] = self.now
        ps.stage_gpus[(a.step, a.stage)] = len(gpus)
        for g in gpus:
            self.last[g] = a.pipeline
        if a.stage == ROLLOUT:
            self._start_rollout(ps, a.step, gpus, a.sm_share)
        else:
            self._start_gang(ps, a.step, a.stage, gpus, a.sm_share)
        if a.sm_share < 1.0:
            self._rerate(gpus)

    def _claim(self, gpus: tuple[int, ...], task: _Task, what: StartStage | str, share: float) -> None:
        for g in gpus:
            occ = self.occ[g]
            if occ and (share >= 1.0 or len(occ) > 1):
                raise SimulationError(f"{self.policy.name}: GPU {g} is busy; cannot start {what}")
            if occ:
                if isinstance(task, _Engine) and isinstance(occ[0], _Engine):
                    raise SimulationError(f"{self.policy.name}: GPU {g} already holds a replica; cannot start {what}")
                occ[0].shares[g] = min(occ[0].shares[g], 1.0 - share)  # the occupant's lease shrinks
                occ[0].low[g] = min(occ[0].low[g], occ[0].shares[g])
            occ.append(task)
            task.shares[g] = task.low[g] = share
        task.marks = [(self.now, self.now, 1.0)]

    def _release(self, task: _Task) -> None:
        for g in task.gpus:
            self.occ[g].remove(task)
            if len(self.occ[g]) == 1:  # a co-located occupant left alone gets its slot back (as live)
                self.occ[g][0].shares[g] = 1.0
        if any(self.occ[g] for g in task.gpus):
            self._rerate(task.gpus)

    def _kv_bytes(self, g: int) -> float:
        """KV cache held on GPU ``g`` by live sequences of the replicas there."""
        return sum(
            t.engine.kv_reserved * t.engine.model.kv_bytes_per_token / t.engine.tp
            for t in self.occ[g]
            if isinstance(t, _Engine)
        )

    def _start_rollout(self, ps: _Pipe, step: int, gpus: tuple[int, ...], share: float = 1.0) -> None:
        spec, tp = ps.spec, ps.spec.rollout_tp
        joined = [e for e in self.engines if e.pipeline == spec.name and set(e.gpus) <= set(gpus)]
        fresh = [g for g in gpus if not any(g in e.gpus for e in joined)]
        if joined and not ps.mode.overlap_rollouts:
            raise SimulationError(
                f"{self.policy.name}: {spec.name} rollout {step} joins live replicas in a mode without overlap"
            )
        if len(fresh) % tp:
            raise SimulationError(f"{self.policy.name}: rollout of {spec.name} needs GPUs in groups of {tp}")
        engines = list(joined)
        weight_bytes = rollout_weight_bytes(spec.model) / tp
        if share < 1.0:  # joining a gang: idle state of others makes room for the KV cache first
            pinned = self._pinned()
            for g in fresh:
                for k in [k for k in self.resident[g] if k not in pinned and k[0] != spec.name]:
                    for h in range(self.n):
                        self.resident[h].pop(k, None)
        for i in range(0, len(fresh), tp):
            group = tuple(fresh[i : i + tp])
            key = (spec.name, "rollout", group)
            load_s = self._make_resident(group, key, weight_bytes)
            others = max(sum(b for k, b in self.resident[g].items() if k != key) for g in group)
            cap = kv_capacity_tokens(spec.model, self.w.cluster.gpu, tp=tp, other_resident_bytes=others)
            longest = max(r.prompt_len + r.response_len for r in step_requests(ps.samples[step]))
            if cap < longest:  # idle state left no room for even one request: evict it (LRU) for a few
                pinned = self._pinned() | {key}
                while cap < 4 * longest:
                    victim = next((k for g in group for k in self.resident[g] if k not in pinned), None)
                    if victim is None:
                        break
                    for h in range(self.n):
                        self.resident[h].pop(victim, None)
                    others = max(sum(b for k, b in self.resident[g].items() if k != key) for g in group)
                    cap = kv_capacity_tokens(spec.model, self.w.cluster.gpu, tp=tp, other_resident_bytes=others)
            eng = _Engine(
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
            engines.append(eng)
        reqs = step_requests(ps.samples[step])
        ps.remaining[step] = len(reqs)
        ps.finish_offsets[step] = []
        for e in joined:
            e.step = step
        ps.next_rollout = step + 1
        ps.last_rollout_gpus = len(gpus)
        for eng, part in zip(engines, assign_least_loaded(reqs, [e.engine.outstanding for e in engines])):
            if part:
                eng.engine.submit(part, self._local(eng))
            if eng.engine.busy:
                self._arm(eng)
            else:  # more replicas than requests: this one has nothing to do
                self._retire(eng)

    def _start_gang(self, ps: _Pipe, step: int, stage: str, gpus: tuple[int, ...], share: float = 1.0) -> None:
        spec, G = ps.spec, len(gpus)
        key = (spec.name, "train", gpus)
        samples = ps.samples[step]
        seq = (samples.prompt_len + samples.response_len).astype(np.int64)
        streaming = stage == LOGPROB and ps.mode.stream_logprob and not ps.done(step, ROLLOUT)
        if stage == LOGPROB:
            nodes = [] if streaming else logprob_nodes(spec, self.cost, step, G, seq)
        elif stage == UPDATE:
            nodes = update_nodes(spec, self.cost, step, G, seq)
        else:
            same_node = len({g // self.w.cluster.gpus_per_node for g in gpus}) == 1 and (
                ps.mode.colocated or ps.last_rollout_gpus + G <= self.w.cluster.gpus_per_node
            )
            nodes = [
                weight_sync_node(
                    spec,
                    self.cost,
                    step,
                    G,
                    colocated=ps.mode.colocated,
                    rollout_gpus=ps.last_rollout_gpus,
                    same_node=same_node,
                )
            ]
        load_s = self._make_resident(
            gpus, key, train_state_bytes(spec.model, critic=spec.critic, ref_model=spec.ref_model) / G
        )
        gang = _Gang(gpus, pipeline=spec.name, step=step, stage=stage, nodes=deque(), closed=not streaming, key=key)
        if load_s > 0:
            gang.nodes.append((SubStage(spec.name, step, stage, "onload", 0, load_s, "load", G, 0.0, Work()), None))
        gang.nodes.extend((n, None) for n in nodes)
        self._claim(gpus, gang, f"{spec.name} {stage} {step}", share)
        self._shrink_kv(gpus)
        if streaming:
            ps.stream[step] = [gang, [], 0]
            self._feed_stream(ps, step)
        if stage == WEIGHT_SYNC and ps.mode.interrupt_on_update:
            for e in self.engines:
                if e.pipeline == spec.name:
                    e.engine.load_weights(self._local(e), nodes[0].duration_s, interrupt=True)
                    self._arm(e)
        if gang.current is None:
            self._next_node(gang)

    # ---- memory ----------------------------------------------------------------------------------------------
    def _pinned(self) -> set:
        return {t.key for occ in self.occ for t in occ if t.key is not None}

    def _train_homes(self) -> dict[str, tuple[int, ...]]:
        """Per pipeline, the GPUs holding its training state."""
        out: dict[str, tuple[int, ...]] = {}
        for res in self.resident:
            for k in res:
                if k[1] == "train":
                    out.setdefault(k[0], k[2])
        return out

    def _shrink_kv(self, gpus: tuple[int, ...]) -> None:
        """A sub-stage joined replicas' GPUs: their KV cache keeps what it holds and loses the rest."""
        for e in {t for g in gpus for t in self.occ[g] if isinstance(t, _Engine)}:
            others = max(sum(b for k, b in self.resident[g].items() if k != e.key) for g in e.gpus)
            room = kv_capacity_tokens(e.engine.model, self.w.cluster.gpu, tp=e.engine.tp, other_resident_bytes=others)
            e.engine.kv_capacity = max(e.engine.kv_reserved, min(e.engine.kv_capacity, room))

    def _make_resident(self, gpus: tuple[int, ...], key: tuple, bytes_per_gpu: float) -> float:
        """Make ``key`` resident on ``gpus``; return the seconds of host copies it costs (0 if already there)."""
        if all(key in self.resident[g] for g in gpus):
            for g in gpus:
                self.resident[g].move_to_end(key)
            return 0.0
        cap, pinned = usable_bytes(self.w.cluster.gpu), self._pinned() | {key}
        # A pipeline's training state lives on one GPU set: a new set replaces the old (re-sharded from host).
        if key[1] == "train":
            for g in range(self.n):
                for k in [k for k in self.resident[g] if k[:2] == key[:2] and k != key]:
                    if k in pinned:
                        raise SimulationError(f"{self.policy.name}: {key[0]} training state is in use on other GPUs")
                    del self.resident[g][k]
        evicted = 0.0
        for g in gpus:
            res = self.resident[g]
            while sum(res.values()) + self._kv_bytes(g) + bytes_per_gpu > cap:
                victim = next((k for k in res if k not in pinned), None)
                if victim is None:
                    raise SimulationError(
                        f"{self.policy.name}: GPU {g} cannot hold {key[0]} {key[1]} state "
                        f"({bytes_per_gpu / 2**30:.1f} GiB) beside state in use"
                    )
                evicted = max(evicted, res[victim])
                for h in range(self.n):  # a state is evicted from every GPU that holds it
                    self.resident[h].pop(victim, None)
            res[key] = bytes_per_gpu
        return self.cost.host_copy(bytes_per_gpu) + self.cost.host_copy(evicted)

    # ---- running tasks ---------------------------------------------------------------------------------------
    def _record(self, task: _Task, node: SubStage, start: float, end: float, ready: float | None = None) -> None:
        if end > start:
            shares = tuple(task.low[g] for g in task.gpus)  # the share it had throughout the slice
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

    def _record_acts(self, e: _Engine, acts) -> None:
        ps = self.pipes[e.pipeline]
        for a in acts:
            node = activity_node(ps.spec, e.step, e.worker, a, 0.0)
            self._record(e, node, self._to_sim(e, a.start_s), self._to_sim(e, a.end_s))
        if acts:
            e.low = dict(e.shares)

    def _on_engine(self, e: _Engine) -> None:
        # NOTE: the event is due. A slowed-down engine advances to its own event time, so float rounding of its
        # local clock can never leave the event pending; a never-slowed one sees the simulator's clock as is.
        sim, local, rate = e.marks[-1]
        exact = sim == local and rate == 1.0
        done, acts = e.engine.advance(self.now if exact else max(self._local(e), e.engine.next_event_s()))
        ps = self.pipes[e.pipeline]
        self._record_acts(e, acts)
        for req, t, generated in done:
            self._sample_done(ps, req.step, req.index, generated, self._to_sim(e, t))
        if e.engine.busy:
            self._arm(e)
            if any(len(self.occ[g]) > 1 for g in e.gpus):
                self._rerate(e.gpus)
        else:
            self._retire(e)

    def _retire(self, e: _Engine) -> None:
        """A replica with nothing left to generate frees its GPUs (its weights stay resident)."""
        self.reprefill_tokens += e.engine.reprefill_tokens
        e.token += 1  # an event still queued for it (a migrated source) is stale
        self.engines.remove(e)
        self._release(e)

    # ---- migration -------------------------------------------------------------------------------------------
    def _migrate(self, m: Migrate) -> None:
        by_id = {e.worker: e for e in self.engines}
        ids = list(m.sources) + list(m.targets)
        if not m.sources or not m.targets or len(set(ids)) != len(ids) or any(i not in by_id for i in ids):
            raise SimulationError(f"{self.policy.name}: {m} names replicas that are not live, or repeats one")
        if any(by_id[i].pipeline != m.pipeline for i in ids):
            raise SimulationError(f"{self.policy.name}: {m} mixes pipelines")
        targets = [by_id[i] for i in m.targets]
        moved, freed = [], 0.0
        for i in m.sources:
            e = by_id[i]
            eng = e.engine
            remaining = max((s.req.response_len - s.generated for s in eng.live), default=0)
            step_s = self.cost.decode_step(eng.model, eng.tp, max(1, eng.live_count), eng.context_tokens)
            freed += remaining * step_s / max(e.rate, 1e-9) * len(e.gpus)
            reqs, acts = eng.abort(self._local(e))
            self._record_acts(e, acts)
            moved += reqs
            self._retire(e)
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
            if any(len(self.occ[g]) > 1 for g in t.gpus):
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

    def _sample_done(self, ps: _Pipe, step: int, index: int, generated: int, t: float) -> None:
        ps.generated[step][index] += generated
        ps.completions[step][index] += 1
        ps.finish_offsets[step].append(t - ps.started[(step, ROLLOUT)])
        ps.remaining[step] -= 1
        if step in ps.stream:
            s = ps.samples[step]
            ps.stream[step][1].append((int(s.prompt_len[index] + s.response_len[index]), t))
        if ps.remaining[step] == 0:
            self._stage_done(ps, step, ROLLOUT, t)
        if step in ps.stream:
            self._feed_stream(ps, step)

    def _feed_stream(self, ps: _Pipe, step: int) -> None:
        """Turn finished samples into log-prob micro-batches once a micro-batch's worth has arrived (or the
        rollout is over)."""
        gang, pending, j = ps.stream[step]
        budget = len(gang.gpus) * ps.spec.train_micro_batch_tokens
        over = ps.done(step, ROLLOUT)
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

    def _next_node(self, gang: _Gang) -> None:
        if gang.nodes:
            node, ready = gang.nodes.popleft()
            local = self._local(gang)
            gang.current = (node, local, local + node.duration_s, ready, self.now)
            self._arm(gang)
            if any(len(self.occ[g]) > 1 for g in gang.gpus):
                self._rerate(gang.gpus)
        elif gang.closed:
            gang.current = None
            self._release(gang)
            self._stage_done(self.pipes[gang.pipeline], gang.step, gang.stage, self.now)
        else:
            gang.current = None

    def _on_gang(self, gang: _Gang) -> None:
        node, _, _, ready, start = gang.current
        self._record(gang, node, start, self.now, ready)
        gang.low = dict(gang.shares)
        gang.current = None
        self._next_node(gang)

    def _stage_done(self, ps: _Pipe, step: int, stage: str, t: float) -> None:
        ps.status[(step, stage)] = "done"
        width = ps.stage_gpus.get((step, stage), 0)
        self.stage_log.append(StageRecord(ps.spec.name, step, stage, ps.started[(step, stage)], t, width))
        self.history.append(
            StageTiming(
                pipeline=ps.spec.name,
                step=step,
                stage=stage,
                start_s=ps.started[(step, stage)],
                end_s=t,
                gpus=width,
                finish_offsets_s=tuple(sorted(ps.finish_offsets.get(step, ()))) if stage == ROLLOUT else (),
            )
        )
        if stage == WEIGHT_SYNC:
            ps.version += 1
        if stage == UPDATE and step == ps.spec.steps - 1:
            ps.finished, ps.finish_s = True, t
            for res in self.resident:  # a finished job releases its device memory (its idle state would
                for k in [k for k in res if k[0] == ps.spec.name]:  # otherwise shrink others' KV caches)
                    del res[k]
