"""The scheduling interface: immutable snapshots in, immutable plans out.

Executors (the simulator, later the live runtime) call :meth:`Policy.schedule` whenever something changed: a
stage became ready, GPUs were freed, a pipeline arrived. The policy sees a :class:`Snapshot` and returns a
:class:`SchedulerOutput` listing what to start where. It never mutates the snapshot, reads a clock or does I/O,
so the same policy object runs in simulation and live. Policies that search configurations (splits, orders)
fix them at construction, from the workload alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from .spec import WorkloadSpec


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
        running: ``(step, stage, gpus)`` of its stages in progress.
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
    """

    now_s: float
    num_gpus: int
    free_gpus: frozenset[int]
    ready: tuple[ReadyStage, ...]
    pipelines: tuple[PipelineView, ...]
    last_pipeline: tuple[str | None, ...]


@dataclass(frozen=True)
class StartStage:
    """Start ``stage`` of ``pipeline``'s ``step`` on ``gpus`` (exclusively)."""

    pipeline: str
    step: int
    stage: str
    gpus: tuple[int, ...]


@dataclass(frozen=True)
class SchedulerOutput:
    """The plan for this decision point: stages to start, in order. Empty means wait."""

    actions: tuple[StartStage, ...] = ()


class Policy(Protocol):
    """A scheduling policy. ``name`` is its registry name; ``config`` describes the fixed choices it made."""

    name: str
    config: str

    def mode(self, pipeline: str) -> ExecutionMode:
        """How ``pipeline``'s steps depend on each other under this policy."""

    def schedule(self, snapshot: Snapshot) -> SchedulerOutput:
        """Decide what starts now. Called by the executor after every change; must be pure."""


class PolicyFactory(Protocol):
    """What the policy registry holds: a callable that returns every configuration of the policy to try on a
    workload; the executor reports the best (e.g. StreamRL's rollout/training split)."""

    def __call__(self, workload: WorkloadSpec) -> list[Policy]: ...
