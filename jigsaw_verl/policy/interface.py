"""The scheduling interface: immutable snapshots in, immutable plans out.

Executors (the simulator, later the live runtime) call :meth:`Policy.schedule` whenever something changed: a
stage became ready, GPUs were freed, a request finished, a pipeline arrived. The policy sees a :class:`Snapshot`
and returns a :class:`SchedulerOutput` listing what to start where (:class:`StartStage`, exclusively or
co-located with a share of each GPU), which rollout replicas to merge (:class:`Migrate`) and which tails to move
onto a wider replica (:class:`WidenTail`). It never mutates
the snapshot, reads a clock or does I/O, so the same policy object runs in simulation and live. Policies that
search configurations (splits, orders) fix them at construction, from the workload alone (a search that needs
to simulate is handed the simulation by the executor that builds the policy).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

# What an executor must be able to do for a policy beyond on-policy synchronous steps (one feature per
# ExecutionMode field that departs from that): start a rollout from weights up to ``staleness`` versions old, stream
# finished samples into the log-prob passes, let a rollout join replicas still generating the previous step, and
# interrupt live requests with new weights (they re-prefill and go on).
EXECUTION_FEATURES: tuple[str, ...] = ("staleness", "streaming", "overlapping", "interruptible")


@dataclass(frozen=True, kw_only=True)
class ExecutionMode:
    """How a policy runs one pipeline's steps (the dependency rules between its stages).

    Attributes:
        staleness: rollout of step k may start once policy version k - staleness exists (0 = on-policy sync).
        stream_logprob: log-prob micro-batches of step k start as its samples finish (StreamRL-style streaming).
        overlap_rollouts: rollout of step k may join replicas still generating step k - 1 (continuous batching).
        interrupt_on_update: new weights interrupt live requests, which re-prefill and go on (AReaL).
        colocated: weight sync reshards in place on the training GPUs (verl's hybrid engine) rather than
            broadcasting to separate rollout GPUs.
    """

    staleness: int = 0
    stream_logprob: bool = False
    overlap_rollouts: bool = False
    interrupt_on_update: bool = False
    colocated: bool = True


def features_of(mode: ExecutionMode) -> frozenset[str]:
    """The :data:`EXECUTION_FEATURES` an executor needs to run a pipeline in ``mode``."""
    used = {
        "staleness": mode.staleness > 0,
        "streaming": mode.stream_logprob,
        "overlapping": mode.overlap_rollouts,
        "interruptible": mode.interrupt_on_update,
    }
    return frozenset(f for f in EXECUTION_FEATURES if used[f])


@dataclass(frozen=True)
class ReadyStage:
    """A stage whose dependencies are met and that has not started."""

    pipeline: str
    step: int
    stage: str


@dataclass(frozen=True, kw_only=True)
class PipelineView:
    """What a policy may know of one pipeline.

    Attributes:
        name: pipeline name.
        index: position in the workload file.
        arrival_s: when it joins (or joined) the pool, seconds.
        arrived: whether it has joined the pool.
        started: whether any of its stages has begun.
        finished: whether all its steps are done.
        version: policy versions published to rollout (weight syncs done).
        steps_done: steps whose update finished.
        running: ``(step, stage, gpus)`` of its stages in progress (step -1 for its live rollout replicas).
        running_since_s: when each of ``running`` started, seconds (empty when the executor does not say).
        train_gpus: GPUs holding its training state resident (empty when none or not said).
        rollout_gpus: GPUs holding its live rollout replicas (a rollout may join them when its mode allows).
    """

    name: str
    index: int
    arrival_s: float
    arrived: bool
    started: bool
    finished: bool
    version: int
    steps_done: int
    running: tuple[tuple[int, str, tuple[int, ...]], ...]
    rollout_gpus: frozenset[int]
    running_since_s: tuple[float, ...] = ()
    train_gpus: tuple[int, ...] = ()


@dataclass(frozen=True, kw_only=True)
class ReplicaView:
    """One live rollout replica (what the migration planner looks at).

    Attributes:
        replica: the executor's id of the replica, unique within a run.
        pipeline: pipeline name.
        step: the step whose requests it generates (the latest, when rollouts overlap).
        gpus: its tensor-parallel group.
        live: sequences admitted and not finished.
        queued: requests waiting for admission.
        context_tokens: prompt + generated tokens of the live sequences (the KV they hold).
        generated_tokens: tokens generated so far by the live sequences.
        started_s: when the replica started, seconds.
    """

    replica: int
    pipeline: str
    step: int
    gpus: tuple[int, ...]
    live: int
    queued: int
    context_tokens: int
    generated_tokens: int
    started_s: float


@dataclass(frozen=True, kw_only=True)
class Lease:
    """A running sub-stage's hold on one GPU.

    Attributes:
        pipeline: pipeline name.
        stage: stage name.
        sm_share: fraction of the GPU's SMs leased, (0, 1].
        replica: the replica id for rollout leases, else ``None``.
    """

    pipeline: str
    stage: str
    sm_share: float
    replica: int | None = None


@dataclass(frozen=True, kw_only=True)
class StageTiming:
    """A finished stage, as the predictor learns from it.

    Attributes:
        pipeline: pipeline name.
        step: step index.
        stage: stage name.
        start_s: begin, seconds.
        end_s: end, seconds.
        gpus: GPUs it started on.
        finish_offsets_s: rollout only: when each response finished, seconds after ``start_s``, sorted (the
            live-batch curve of the step: live(t) = responses - #offsets <= t).
    """

    pipeline: str
    step: int
    stage: str
    start_s: float
    end_s: float
    gpus: int
    finish_offsets_s: tuple[float, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Snapshot:
    """The state a policy decides on.

    Attributes:
        now_s: simulated or wall time, seconds.
        num_gpus: pool size.
        free_gpus: GPUs running nothing.
        ready: stages that can start now, in (pipeline index, step, stage) order.
        pipelines: one view per pipeline, in workload order.
        last_pipeline: per GPU, the pipeline whose stage ran there last (``None`` if never used).
        leases: per GPU, the leases on it (empty when free; at most two, SM shares summing to at most 1).
        free_bytes: per GPU, device memory not held by running sub-stages (idle resident state counts as free:
            it can be evicted), bytes.
        replicas: live rollout replicas, by id.
        history: finished stages, oldest first (the executor may keep only the last few steps per pipeline).
        gpus_per_node: GPUs on each of the pool's nodes (GPU ``g`` on node ``g // gpus_per_node``; NVLink within a
            node, the NIC across); 0: the pool is one node.
    """

    now_s: float
    num_gpus: int
    free_gpus: frozenset[int]
    ready: tuple[ReadyStage, ...]
    pipelines: tuple[PipelineView, ...]
    last_pipeline: tuple[str | None, ...]
    leases: tuple[tuple[Lease, ...], ...] = ()
    free_bytes: tuple[float, ...] = ()
    replicas: tuple[ReplicaView, ...] = ()
    history: tuple[StageTiming, ...] = ()
    gpus_per_node: int = 0


@dataclass(frozen=True)
class StartStage:
    """Start ``stage`` of ``pipeline``'s ``step`` on ``gpus``.

    Attributes:
        pipeline: pipeline name.
        step: step index.
        stage: stage name.
        gpus: GPU indices.
        sm_share: SM share it leases on each of its GPUs, (0, 1]. 1 means exclusive (every GPU must be free).
            Below 1 it may join a GPU held by one other sub-stage, whose lease there shrinks to ``1 - sm_share``
            (Green Contexts / MPS are re-created between kernels); memory must fit both.
    """

    pipeline: str
    step: int
    stage: str
    gpus: tuple[int, ...]
    sm_share: float = 1.0


@dataclass(frozen=True)
class Migrate:
    """Merge a pipeline's rollout replicas: abort every request on ``sources`` and resume each on one of
    ``targets`` (least outstanding first), re-prefilling prompt + tokens so far; the sources free their GPUs.

    Attributes:
        pipeline: pipeline name.
        sources: replica ids to empty and free (k - m of them).
        targets: replica ids that take the requests (m of them, disjoint from ``sources``).
    """

    pipeline: str
    sources: tuple[int, ...]
    targets: tuple[int, ...]


@dataclass(frozen=True)
class WidenTail:
    """Move a pipeline's long tail onto one wider rollout replica: abort every request on ``sources`` and resume
    them all on a new replica of tensor-parallel size ``len(gpus)`` built on ``gpus``, re-prefilling prompt +
    tokens so far at the wide replica's rate; the sources' other GPUs free. The wide engine's weights are loaded
    unless resident, and its memory is counted like any replica's.

    Attributes:
        pipeline: pipeline name.
        sources: replica ids to empty and free (every live replica of the rollout, or some of them).
        gpus: the new replica's GPUs: on one node, each one the sources' or free, as many as the pipeline's
            ``rollout_elastic_tp`` allows at most (a multiple of its ``rollout_tp``, more than the widest source).
    """

    pipeline: str
    sources: tuple[int, ...]
    gpus: tuple[int, ...]


@dataclass(frozen=True)
class SchedulerOutput:
    """The plan for this decision point: actions applied in order. Empty means wait."""

    actions: tuple[StartStage | Migrate | WidenTail, ...] = ()


class Policy(Protocol):
    """A scheduling policy. ``name`` is its registry name; ``config`` describes the fixed choices it made.

    A policy that reads the snapshot's ``leases``, ``free_bytes``, ``replicas`` or ``history`` sets a class
    attribute ``detailed_snapshot = True``; executors may leave those fields empty for the others (building them
    at every decision costs more than a static placement's whole decision). A policy whose decision is empty
    whenever no stage is ready sets ``acts_only_on_ready = True``; executors may then skip asking it (at 1024 GPUs
    nearly every event is a request finishing, and building the detailed snapshot is most of a decision's cost).
    """

    name: str
    config: str

    def mode(self, pipeline: str) -> ExecutionMode:
        """How ``pipeline``'s steps depend on each other under this policy."""

    def schedule(self, snapshot: Snapshot) -> SchedulerOutput:
        """Decide what starts now. Called by the executor after every change; must be pure."""
