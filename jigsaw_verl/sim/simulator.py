"""A deterministic discrete-event simulator that executes a scheduling policy over a GPU pool.

Events are ordered by (time, priority, sequence number); the sequence counter belongs to the simulator
instance, so runs never leak into each other and the same workload, seed and policy always give the same result.
The loop is short: pop every event due now, let it advance its replica or gang task, then ask the policy what
to start (:meth:`Simulator._decide`). The simulator is one clock over the pool mechanism
(:mod:`jigsaw_verl.pool`): plans are applied through its slot holds (a refusal is a :class:`SimulationError`),
progress is marked in its pipeline records, and the policy's snapshot comes from its one builder. What runs:

- a rollout stage runs on replicas (:class:`~jigsaw_verl.model.rollout_engine.ReplicaEngine`), each freeing its
  GPUs as soon as it has nothing left to generate, except a hybrid-engine rollout's (``ExecutionMode.colocated``):
  verl sleeps those engines together, so an idle one holds its GPUs until the rollout ends or a ``Migrate`` frees
  it (as the live executor's rollout lease does);
- every other stage runs as one *gang* over its GPUs, node by node (the nodes of :mod:`jigsaw_verl.model.graph`).

Co-location: two co-located sub-stages progress at the speeds :meth:`CostModel.colocated_rates` gives for their
current nodes; every task keeps a local clock (:mod:`.tasks`) that runs at its current rate, so when rates change
the remaining work is rescaled. A task alone on its GPUs runs at full speed. Migration
(:class:`~jigsaw_verl.policy.interface.Migrate`) aborts the requests of some replicas of a pipeline and resumes
them on others, which re-prefill prompt + tokens so far; a tail move
(:class:`~jigsaw_verl.policy.interface.WidenTail`) resumes them on one new replica of larger tensor-parallel size
(:mod:`.replicas`). Memory: :mod:`.device_memory`.
"""

from __future__ import annotations

import heapq
from collections import deque

import numpy as np

from jigsaw_verl.model.cost_model import CostModel, Work
from jigsaw_verl.model.graph import (
    LOGPROB,
    ROLLOUT,
    UPDATE,
    WEIGHT_SYNC,
    SubStage,
    logprob_nodes,
    update_nodes,
    weight_sync_node,
)
from jigsaw_verl.model.lengths import sample_steps
from jigsaw_verl.model.memory import train_state_bytes
from jigsaw_verl.model.spec import WorkloadSpec
from jigsaw_verl.policy.interface import (
    Migrate,
    Policy,
    ReadyStage,
    ReplicaView,
    SchedulerOutput,
    Snapshot,
    StartStage,
    WidenTail,
)
from jigsaw_verl.pool.holds import Hold, Refusal, SlotHolds
from jigsaw_verl.pool.snapshot import ExecutorView, build_snapshot
from jigsaw_verl.pool.timeline import StageRecord
from jigsaw_verl.sim.device_memory import DeviceMemory, OutOfDeviceMemory
from jigsaw_verl.sim.replicas import ReplicaRunner, SimPipe, SimulationError
from jigsaw_verl.sim.result import SimResult
from jigsaw_verl.sim.tasks import EPS, Engine, Gang, Task

_ARRIVE, _TASK = 0, 1

__all__ = ["SimResult", "SimulationError", "Simulator"]


class Simulator(ReplicaRunner):
    """Run ``policy`` over ``workload``.

    Args:
        workload: the pool and pipelines.
        policy: the scheduling policy (one configuration).
        cost: cost model; defaults to the workload GPU's with default efficiencies.
    """

    def __init__(self, workload: WorkloadSpec, policy: Policy, cost: CostModel | None = None):
        self.w = workload
        self.policy = policy
        self.cost = cost or CostModel.for_cluster(workload.cluster)
        self.cost_across_nodes = self.cost.across_nodes()  # for gangs that span nodes
        self.n = workload.cluster.num_gpus
        self.pipes = {
            p.name: SimPipe.of(p, i, policy.mode(p.name), sample_steps(p, workload.seed))
            for i, p in enumerate(workload.pipelines)
        }
        self.now = 0.0
        self._seq = 0
        self._heap: list = []
        self.holds = SlotHolds(self.n, self.w.cluster.gpus_per_node)
        self.memory = DeviceMemory(self.holds, workload.cluster.gpu, self.cost)
        self.engines: list[Engine] = []
        self.slices: list = []
        self.stage_log: list[StageRecord] = []
        self.reprefill_tokens = 0
        self.migrations: list = []
        self.history: list = []
        self._next_replica = 0
        self._pair_memo: dict = {}  # co-location speeds of task pairs (Simulator._rate)
        self._view_parts: tuple | None = None  # (stamp, replica_of, history) of the last view (Simulator.view)

    # ---- event plumbing --------------------------------------------------------------------------------------
    def _push(self, t: float, prio: int, item) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, prio, self._seq, item))

    def _arm(self, task: Task) -> None:
        """(Re)schedule a task's next event; older heap entries for it become stale."""
        task.token += 1
        t = task.engine.next_event_s() if isinstance(task, Engine) else (task.current[2] if task.current else None)
        if t is not None:
            self._push(task.to_sim(t), _TASK, (task, task.token))

    def _tasks(self, g: int) -> list[Task]:
        return [h.owner for h in self.holds.on(g)]

    # ---- local clocks (progress under co-location) -----------------------------------------------------------
    def _local(self, task: Task) -> float:
        return task.local(self.now)

    def _load(self, task: Task, g: int):
        if isinstance(task, Engine):
            work, dur = task.engine.current_load()
            gpus = len(task.gpus)
        else:
            node = task.current[0] if task.current else None
            work, dur, gpus = (node.work, node.duration_s, len(task.gpus)) if node else (Work(), 0.0, 1)
        return self.cost.stage_load(work, dur, gpus, sm_share=task.hold.shares[g], mem_share=0.0)

    def _rate(self, task: Task) -> float:
        """``task``'s speed now: the slowest of its GPUs, each shared by at most two tasks. The speeds of a pair
        are kept while neither's load nor their shares there change (:meth:`Task.load_stamp`): a gang over many
        GPUs beside replicas is re-rated at every replica event, and only that replica's GPUs changed. The memo's
        keys hold the tasks themselves (compared by identity), so no entry outlives its tasks' identities."""
        rate, memo = 1.0, self._pair_memo
        for g in task.gpus:
            held = self.holds.on(g)
            if len(held) != 2:
                continue
            ha, hb = held
            a, b = ha.owner, hb.owner
            key = (a, b, a.load_stamp(), b.load_stamp(), ha.shares[g], hb.shares[g])
            rates = memo.get(key, False)
            if rates is False:
                if len(memo) > 100_000:
                    memo.clear()
                rates = memo[key] = self.cost.colocated_rates(self._load(a, g), self._load(b, g))
            if rates is None:
                raise SimulationError(f"{self.policy.name}: SM shares on GPU {g} exceed 1")
            rate = min(rate, rates[0] if a is task else rates[1])
        return rate

    def _rerate(self, gpus) -> None:
        """Occupancy or a node changed on ``gpus``: give every task there its current speed."""
        tasks: dict[int, Task] = {}
        for g in gpus:
            for t in self._tasks(g):
                tasks.setdefault(id(t), t)
        for t in tasks.values():
            r = self._rate(t)
            if r != t.rate:
                t.marks.append((self.now, self._local(t), r))
                t.rate = r
                self._arm(t)

    def _shared(self, task: Task) -> bool:
        return any(len(self.holds.on(g)) > 1 for g in task.gpus)

    def run(self) -> SimResult:
        """Simulate to the end and return the result record."""
        for ps in self.pipes.values():
            self._push(ps.spec.arrival_s, _ARRIVE, ps)
        while self._heap:
            self.now = self._heap[0][0]
            while self._heap and self._heap[0][0] <= self.now + EPS:
                _, _, _, item = heapq.heappop(self._heap)
                if isinstance(item, SimPipe):
                    item.progress.arrived = True
                else:
                    task, token = item
                    if token == task.token:
                        self._on_engine(task) if isinstance(task, Engine) else self._on_gang(task)
            self._decide()
        unfinished = [p for p, ps in self.pipes.items() if not ps.progress.finished]
        if unfinished:
            raise SimulationError(
                f"policy {self.policy.name} ({self.policy.config}) stopped scheduling at t={self.now:.1f}s with "
                f"pipelines unfinished: {', '.join(unfinished)}"
            )
        return self._result()

    def _result(self) -> SimResult:
        return SimResult(
            workload=self.w.name,
            policy=self.policy.name,
            config=self.policy.config,
            num_gpus=self.n,
            makespan_s=max(ps.progress.finish_s for ps in self.pipes.values()),
            finish_s={p: ps.progress.finish_s for p, ps in self.pipes.items()},
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
        idle_silent = getattr(self.policy, "acts_only_on_ready", False)
        for _ in range(1000):
            ready = self._ready()
            if idle_silent and not ready:
                return
            out: SchedulerOutput = self.policy.schedule(self.snapshot(ready))
            if not out.actions:
                return
            for action in out.actions:
                if isinstance(action, Migrate):
                    self._migrate(action)
                elif isinstance(action, WidenTail):
                    self._widen(action)
                else:
                    self._start(action)
        raise SimulationError(f"policy {self.policy.name} kept starting stages at t={self.now:.3f}s without end")

    def _ready(self) -> tuple[ReadyStage, ...]:
        """The ready stages of every pipeline, each pipeline's kept until it starts or ends a stage or arrives."""
        out: list[ReadyStage] = []
        for ps in self.pipes.values():
            stamp = (ps.progress.changes, ps.progress.arrived)
            if ps.ready_cache is None or ps.ready_cache[0] != stamp:
                ready = tuple(ReadyStage(ps.spec.name, k, s) for k, s in ps.progress.ready(ps.mode))
                ps.ready_cache = (stamp, ready)
            out.extend(ps.ready_cache[1])
        return tuple(out)

    def snapshot(self, ready: tuple[ReadyStage, ...] | None = None) -> Snapshot:
        """What the policy sees now, from the pool's one snapshot builder (``ready``: the ready stages, if known)."""
        ready = self._ready() if ready is None else ready
        view = self.view(ready) if getattr(self.policy, "detailed_snapshot", False) else ExecutorView(ready=ready)
        progress = [ps.progress for ps in self.pipes.values()]
        return build_snapshot(now_s=self.now, holds=self.holds, pipelines=progress, view=view)

    def view(self, ready: tuple[ReadyStage, ...]) -> ExecutorView:
        """What the simulator alone knows: its replica engines, resident memory, training homes, history."""
        # a replica's view is rebuilt only when its engine or step changed (most events touch one of a thousand)
        replicas = tuple(
            e.view_cache[1]
            if e.view_cache is not None and e.view_cache[0] == (e.engine.version, e.step)
            else self._replica_view(e)
            for e in self.engines
        )
        stamp = (self.holds.version, len(self.engines), len(self.history))  # replicas come and go with holds
        if self._view_parts is None or self._view_parts[0] != stamp:
            replica_of = {g: e.worker for e in self.engines for g in e.gpus}
            self._view_parts = (stamp, replica_of, tuple(self.history))
        _, replica_of, history = self._view_parts
        return ExecutorView(
            ready=ready,
            replicas=replicas,
            replica_of=replica_of,
            free_bytes=self.memory.free_bytes(),
            train_slots=self.memory.train_homes(),
            history=history,
        )

    @staticmethod
    def _replica_view(e: Engine) -> ReplicaView:
        """``e`` as the policy sees it now, kept with its stamp for :meth:`view` to reuse."""
        view = ReplicaView(
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
        e.view_cache = ((e.engine.version, e.step), view)
        return view

    # ---- starting stages -------------------------------------------------------------------------------------
    def _start(self, a: StartStage) -> None:
        ps = self.pipes.get(a.pipeline)
        if ps is None or (a.step, a.stage) not in ps.progress.ready(ps.mode):
            raise SimulationError(f"{self.policy.name}: {a} is not ready at t={self.now:.3f}s")
        gpus = tuple(sorted(set(a.gpus)))
        if not gpus or len(gpus) != len(a.gpus) or gpus[0] < 0 or gpus[-1] >= self.n:
            raise SimulationError(f"{self.policy.name}: {a} names invalid GPUs")
        if not 0.0 < a.sm_share <= 1.0:
            raise SimulationError(f"{self.policy.name}: {a} has an SM share outside (0, 1]")
        ps.progress.start(a.step, a.stage, self.now, len(gpus))
        for g in gpus:
            self.holds.last[g] = a.pipeline
        try:
            if a.stage == ROLLOUT:
                self._start_rollout(ps, a.step, gpus, a.sm_share)
            else:
                self._start_gang(ps, a.step, a.stage, gpus, a.sm_share)
        except OutOfDeviceMemory as err:
            raise SimulationError(f"{self.policy.name}: {err}") from None
        if a.sm_share < 1.0:
            self._rerate(gpus)

    def _claim(self, gpus: tuple[int, ...], task: Task, what: str, share: float) -> None:
        """Apply a placement through the pool's holds; a refusal means the policy asked for the impossible."""
        hold = Hold(task.pipeline, task.step, task.stage, replica=getattr(task, "worker", None), owner=task)
        claimed = self.holds.claim(hold, gpus, share, self.now)
        if isinstance(claimed, Refusal):
            raise SimulationError(f"{self.policy.name}: {claimed.reason}; cannot start {what}")
        task.hold = hold
        task.marks = [(self.now, self.now, 1.0)]

    def _release(self, task: Task) -> None:
        self.holds.release(task.hold, self.now)
        if any(self.holds.on(g) for g in task.gpus):
            self._rerate(task.gpus)

    def _start_gang(self, ps: SimPipe, step: int, stage: str, gpus: tuple[int, ...], share: float = 1.0) -> None:
        spec, G = ps.spec, len(gpus)
        key = (spec.name, "train", gpus)
        streaming = stage == LOGPROB and ps.mode.stream_logprob and not ps.progress.done(step, ROLLOUT)
        nodes = self._gang_nodes(ps, step, stage, gpus, streaming)
        state = train_state_bytes(spec.model, critic=spec.critic, ref_model=spec.ref_model) / G
        load_s = self.memory.make_resident(gpus, key, state)
        gang = Gang(gpus, pipeline=spec.name, step=step, stage=stage, nodes=deque(), closed=not streaming, key=key)
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

    def _gang_nodes(self, ps: SimPipe, step: int, stage: str, gpus: tuple[int, ...], streaming: bool) -> list:
        """The sub-stages of a training-side stage on ``gpus``: a gang whose GPUs span nodes runs its FSDP
        collectives (and a co-located sync's) at the NIC's rate, whatever its size."""
        spec, G = ps.spec, len(gpus)
        samples = ps.samples[step]
        seq = (samples.prompt_len + samples.response_len).astype(np.int64)
        one_node = len(self.holds.topology.nodes_of(gpus)) == 1
        cost = self.cost if one_node else self.cost_across_nodes
        if stage == LOGPROB:
            return [] if streaming else logprob_nodes(spec, cost, step, G, seq)
        if stage == UPDATE:
            return update_nodes(spec, cost, step, G, seq)
        same_node = one_node and (ps.mode.colocated or ps.last_rollout_gpus + G <= self.w.cluster.gpus_per_node)
        sync = weight_sync_node(
            spec,
            cost,
            step,
            G,
            colocated=ps.mode.colocated,
            rollout_gpus=ps.last_rollout_gpus,
            same_node=same_node,
        )
        return [sync]

    # ---- gangs -----------------------------------------------------------------------------------------------
    def _next_node(self, gang: Gang) -> None:
        if gang.nodes:
            node, ready = gang.nodes.popleft()
            local = self._local(gang)
            gang.run((node, local, local + node.duration_s, ready, self.now))
            self._arm(gang)
            if self._shared(gang):
                self._rerate(gang.gpus)
        elif gang.closed:
            gang.run(None)
            self._release(gang)
            self._stage_done(self.pipes[gang.pipeline], gang.step, gang.stage, self.now)
        else:
            gang.run(None)

    def _on_gang(self, gang: Gang) -> None:
        node, _, _, ready, start = gang.current
        self._record(gang, node, start, self.now, ready)
        gang.hold.mark()
        gang.run(None)
        self._next_node(gang)

    def _stage_done(self, ps: SimPipe, step: int, stage: str, t: float) -> None:
        offsets = tuple(sorted(ps.finish_offsets.get(step, ()))) if stage == ROLLOUT else ()
        timing = ps.progress.end(step, stage, t, offsets)
        self.stage_log.append(StageRecord(ps.spec.name, step, stage, timing.start_s, t, timing.gpus))
        self.history.append(timing)
        if ps.progress.finished:
            self.memory.release_pipeline(ps.spec.name)
