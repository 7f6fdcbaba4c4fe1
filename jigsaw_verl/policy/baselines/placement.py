"""Static placements the baselines choose from: equal slices of the pool, and rollout/training splits."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from jigsaw_verl.model.graph import ROLLOUT
from jigsaw_verl.model.memory import (
    kv_capacity_tokens,
    min_train_gpus,
    rollout_weight_bytes,
    train_state_bytes,
    usable_bytes,
)
from jigsaw_verl.model.spec import PipelineSpec, WorkloadSpec
from jigsaw_verl.policy.interface import ExecutionMode, ReadyStage, SchedulerOutput, Snapshot, StartStage


@dataclass(frozen=True)
class Assignment:
    """Where one pipeline's stages run: rollout replicas on ``rollout`` GPUs, every other stage on ``train``."""

    rollout: tuple[int, ...]
    train: tuple[int, ...]


class SplitSearch(Protocol):
    """Picks one job's rollout/training split among ``options`` (from :func:`role_splits`).

    The disaggregated baselines pick the split on which the job alone finishes first, which takes simulating it;
    a policy never simulates, so the executor that builds them supplies the search
    (:func:`jigsaw_verl.sim.split_search.fastest_split_alone`).
    """

    def __call__(
        self, spec: PipelineSpec, workload: WorkloadSpec, options: list[Assignment], mode: ExecutionMode, name: str
    ) -> Assignment:
        """The split ``spec`` runs on under ``mode``; ``name`` is the policy's (for the search's own runs)."""


def fits_colocated(spec: PipelineSpec, workload: WorkloadSpec, gpus: int) -> bool:
    """Whether ``gpus`` GPUs hold the sharded training state, the rollout weights and the KV of one longest
    sequence per replica at the same time (verl's hybrid engine)."""
    gpu = workload.cluster.gpu
    if gpus % spec.rollout_tp:
        return False
    train = train_state_bytes(spec.model, critic=spec.critic, ref_model=spec.ref_model) / gpus
    if train + rollout_weight_bytes(spec.model) / spec.rollout_tp > usable_bytes(gpu):
        return False
    longest = spec.prompt_len.max + spec.response_len.max
    cap = kv_capacity_tokens(
        spec.model,
        gpu,
        tp=spec.rollout_tp,
        other_resident_bytes=train,
        gpu_memory_utilization=spec.gpu_memory_utilization,
    )
    return cap >= longest


def min_train(spec: PipelineSpec, workload: WorkloadSpec) -> int:
    return min_train_gpus(spec.model, workload.cluster.gpu, critic=spec.critic, ref_model=spec.ref_model)


def tp_unit(workload: WorkloadSpec) -> int:
    """The GPU granularity every pipeline's replicas tile: lcm of the rollout TP sizes."""
    return math.lcm(*(p.rollout_tp for p in workload.pipelines))


def equal_slices(workload: WorkloadSpec) -> list[tuple[int, ...]] | None:
    """Cut the pool into one contiguous slice per pipeline, as equal as the TP granularity allows (leftover
    units go to the first pipelines); ``None`` when there are too few GPUs for a slice each."""
    unit, P, G = tp_unit(workload), len(workload.pipelines), workload.cluster.num_gpus
    units = G // unit
    if units < P:
        return None
    sizes = [(units // P + (1 if i < units % P else 0)) * unit for i in range(P)]
    out, start = [], 0
    for s in sizes:
        out.append(tuple(range(start, start + s)))
        start += s
    return out


def role_splits(spec: PipelineSpec, workload: WorkloadSpec, gpus: tuple[int, ...]) -> list[Assignment]:
    """Every split of ``gpus`` into rollout GPUs (first, a multiple of the TP size) and training GPUs (enough
    for the training state)."""
    need, tp = min_train(spec, workload), spec.rollout_tp
    return [Assignment(gpus[:r], gpus[r:]) for r in range(tp, len(gpus) - need + 1, tp)]


class StaticPlacementPolicy:
    """Each pipeline's stages go to fixed GPUs; a stage starts as soon as its GPUs are free.

    With ``sequential`` only one pipeline runs at a time: the earliest arrival first, to completion.

    Args:
        name: registry name.
        config: what was fixed, for reports.
        assignments: per pipeline, where its stages run.
        modes: per pipeline, its execution mode.
        sequential: run pipelines one after another.
    """

    def __init__(
        self,
        name: str,
        config: str,
        assignments: dict[str, Assignment],
        modes: dict[str, ExecutionMode],
        *,
        sequential: bool,
    ):
        self.name, self.config = name, config
        self.assignments, self.modes, self.sequential = assignments, modes, sequential

    def mode(self, pipeline: str) -> ExecutionMode:
        return self.modes[pipeline]

    def schedule(self, snapshot: Snapshot) -> SchedulerOutput:
        free = set(snapshot.free_gpus)
        views = {v.name: v for v in snapshot.pipelines}
        allowed = {v.name for v in snapshot.pipelines if v.arrived and not v.finished}
        if self.sequential and allowed:
            # The job already running keeps the pool; otherwise the earliest arrival starts.
            allowed = {min(allowed, key=lambda p: (not views[p].started, views[p].arrival_s, views[p].index))}
        actions = []
        for r in snapshot.ready:
            if r.pipeline not in allowed:
                continue
            gpus = self._gpus(r, views[r.pipeline].rollout_gpus, free)
            if gpus is not None:
                actions.append(StartStage(r.pipeline, r.step, r.stage, gpus))
                free -= set(gpus)
        return SchedulerOutput(tuple(actions))

    def _gpus(self, r: ReadyStage, live: frozenset[int], free: set[int]) -> tuple[int, ...] | None:
        a = self.assignments[r.pipeline]
        if r.stage == ROLLOUT:
            joinable = live if self.modes[r.pipeline].overlap_rollouts else frozenset()
            return a.rollout if all(g in free or g in joinable for g in a.rollout) else None
        return a.train if all(g in free for g in a.train) else None
