"""What only the live executor knows about its pipelines, as the pool's snapshot wants it.

One :class:`LivePipe` per joined pipeline; from them, per slot, the device memory nothing running holds
(:func:`slot_free_bytes`, the simulator's memory rule over what is really resident) and the running rollouts' replicas
as the policy's :class:`~jigsaw_verl.policy.interface.ReplicaView` s (:func:`replica_views`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from jigsaw_verl.model.catalogue import GPUSpec
from jigsaw_verl.model.engine_memory import EngineReservation
from jigsaw_verl.model.graph import ENGINE_STAGES, ROLLOUT
from jigsaw_verl.model.memory import rollout_weight_bytes, train_state_bytes, usable_bytes
from jigsaw_verl.model.spec import PipelineSpec
from jigsaw_verl.policy.interface import ReplicaView
from jigsaw_verl.pool.holds import Hold
from jigsaw_verl.pool.progress import PipelineProgress
from jigsaw_verl.runtime.leases import Grant, MigrationOrder, ReplicaReport

# a replica's id in the snapshot: pipeline index * stride + replica rank (unique within the group)
REPLICA_ID_STRIDE = 10_000


@dataclass(eq=False)
class LivePipe:
    """One joined pipeline: its progress (the pool's record) and what only the live executor tracks."""

    spec: PipelineSpec
    progress: PipelineProgress
    home: tuple[int, ...]
    offload: bool
    engine: EngineReservation | None = None  # what its rollout engine reserves and it pins on each home slot
    requested: tuple[int, str] | None = None
    requested_s: float = 0.0
    running: dict[tuple[int, str], Grant] = field(default_factory=dict)
    holds: dict[tuple[int, str], Hold] = field(default_factory=dict)
    train_gpus: tuple[int, ...] = ()
    # the running rollout's replicas, by rank, as last reported; ranks ordered away / already migrated away
    replicas: dict[int, ReplicaReport] = field(default_factory=dict)
    migrating: set[int] = field(default_factory=set)
    gone: set[int] = field(default_factory=set)
    orders: list[MigrationOrder] = field(default_factory=list)

    @property
    def index(self) -> int:
        return self.progress.index


def replica_slots(ps: LivePipe, grant: Grant) -> dict[int, tuple[int, ...]]:
    """Replica rank -> the slots it runs on: ``rollout_tp`` home slots each, in rank order (verl puts rollout
    replica ``r`` on workers ``r * tp`` to ``(r + 1) * tp - 1``); only the ranks still in the lease."""
    tp = max(1, ps.spec.rollout_tp)
    if len(ps.home) % tp:
        return {}
    held = set(grant.gpus)
    slots = {r: tuple(ps.home[r * tp : (r + 1) * tp]) for r in range(len(ps.home) // tp)}
    return {r: gs for r, gs in slots.items() if set(gs) <= held}


def slot_free_bytes(pipes: Iterable[LivePipe], gpu: GPUSpec, num_slots: int) -> tuple[float, ...]:
    """Per slot, device memory nothing running holds, bytes: each lease's resident state and what a pipeline keeps
    on its home between leases, counted once; the simulator's rule over what is really there."""
    used = [0.0] * num_slots
    for ps in pipes:
        for g, held in _held_bytes(ps, gpu).items():
            used[g] += held
    return tuple(usable_bytes(gpu) - used[g] for g in range(num_slots))


def engine_reservation_bytes(ps: LivePipe, stage: str, gpu: GPUSpec) -> float:
    """Bytes per slot ``ps``'s rollout engines hold during a lease of ``stage``: their whole reservation in a lease
    they are awake in (``ENGINE_STAGES``), where the pipeline said what its engine reserves (``ps.engine``); else 0."""
    return ps.engine.fraction * gpu.memory_bytes if ps.engine is not None and stage in ENGINE_STAGES else 0.0


def _held_bytes(ps: LivePipe, gpu: GPUSpec) -> dict[int, float]:
    """Slot -> bytes pipeline ``ps`` holds there. A lease its engines are awake in (``ENGINE_STAGES``: rollout,
    weight sync, start-up, validation): their reservation where the pipeline said what its engine reserves
    (``ps.engine``), else (a rollout) the replicas' weights (split over the tensor-parallel group) plus the KV each
    reports holding. Any lease but a rollout: the training state sharded over the home. Between leases: the pinned
    bytes it declared, else the training state when it does not offload."""
    held: dict[int, float] = {}

    def add(slots, nbytes: float) -> None:
        for g in slots:
            held[g] = held.get(g, 0.0) + nbytes

    train = set(ps.home) if not ps.offload and ps.engine is None else set()
    tp = max(1, ps.spec.rollout_tp)
    for (step, stage), hold in ps.holds.items():
        if stage != ROLLOUT:
            train |= set(hold.slots) if ps.offload else set()
        reserved = engine_reservation_bytes(ps, stage, gpu)
        if reserved:
            add(hold.slots, reserved)
        elif stage == ROLLOUT:
            add(hold.slots, rollout_weight_bytes(ps.spec.model) / tp)
            for rank, slots in replica_slots(ps, ps.running[(step, stage)]).items():
                rep = ps.replicas.get(rank)
                add(
                    slots if rep is not None else (),
                    rep.kv_held_tokens * ps.spec.model.kv_bytes_per_token / tp if rep else 0.0,
                )
    add(train, train_state_bytes(ps.spec.model, critic=ps.spec.critic, ref_model=ps.spec.ref_model) / len(ps.home))
    if ps.engine is not None:
        add(ps.home, ps.engine.pinned_bytes)
    return held


def replica_views(pipes: Iterable[LivePipe]) -> tuple[tuple[ReplicaView, ...], dict[int, int]]:
    """The running rollouts' reported replicas (not those ordered or migrated away), and slot -> replica id."""
    views, replica_of = [], {}
    for ps in pipes:
        for (step, stage), grant in ps.running.items():
            if stage != ROLLOUT or not ps.replicas:
                continue
            slots = replica_slots(ps, grant)
            for rank, rep in sorted(ps.replicas.items()):
                if rank in ps.migrating or rank not in slots:
                    continue
                rid = ps.index * REPLICA_ID_STRIDE + rank
                replica_of.update((g, rid) for g in slots[rank])
                views.append(
                    ReplicaView(
                        replica=rid,
                        pipeline=ps.spec.name,
                        step=step,
                        gpus=slots[rank],
                        live=rep.live,
                        queued=rep.queued,
                        context_tokens=rep.context_tokens,
                        generated_tokens=rep.generated_tokens,
                        started_s=grant.start_s,
                    )
                )
    return tuple(views), replica_of
