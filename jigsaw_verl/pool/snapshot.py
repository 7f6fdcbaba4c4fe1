"""The only builder of a :class:`~jigsaw_verl.policy.interface.Snapshot`.

Both executors call :func:`build_snapshot` with the pool's :class:`~jigsaw_verl.pool.holds.SlotHolds`, each
pipeline's :class:`~jigsaw_verl.pool.progress.PipelineProgress` and a :class:`ExecutorView` of what only the
executor knows: which stages are ready (the simulator runs the dependency rule, a live pipeline asks), the live
rollout replicas, the memory free on each slot, where each pipeline's training state is resident. What a view does
not know is ``None`` (and the snapshot then says so), never a made-up constant.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from jigsaw_verl.model.graph import ROLLOUT, STAGES
from jigsaw_verl.policy.interface import Lease, PipelineView, ReadyStage, ReplicaView, Snapshot, StageTiming
from jigsaw_verl.pool.holds import SlotHolds
from jigsaw_verl.pool.progress import PipelineProgress


@dataclass(frozen=True, kw_only=True)
class ExecutorView:
    """What the executor alone knows at a decision.

    Attributes:
        ready: stages that may start now, in (pipeline index, step, stage) order.
        replicas: the live rollout replicas (``None``: not said; the basic snapshot of the baselines).
        replica_of: slot -> the replica id of the rollout hold there.
        free_bytes: per slot, device memory not held by running work, bytes (``None``: unknown).
        train_slots: per pipeline, the slots holding its training state resident.
        history: finished stages, oldest first.
    """

    ready: tuple[ReadyStage, ...]
    replicas: tuple[ReplicaView, ...] | None = None
    replica_of: dict[int, int] | None = None
    free_bytes: tuple[float, ...] | None = None
    train_slots: dict[str, tuple[int, ...]] | None = None
    history: tuple[StageTiming, ...] = ()


def running_by_pipeline(holds: SlotHolds) -> dict[str, tuple[tuple[int, str, tuple[int, ...]], ...]]:
    """Per pipeline, its running stages ``(step, stage, slots)`` in slot order; its rollout replicas as one entry
    ``(-1, "rollout", every replica slot)`` after its other stages. Leases outside the step graph are not stages
    (the slots they hold are busy all the same). Kept on ``holds`` until they change; do not mutate."""
    cached = holds.running_cache
    if cached is not None and cached[0] == holds.version:
        return cached[1]
    stages: dict[str, list] = {}
    rollout: dict[str, set[int]] = {}
    for h in holds.holds():
        if h.stage not in STAGES:  # a live lease outside the step graph (start-up, validation): its slots are busy
            continue
        if h.stage == ROLLOUT:
            rollout.setdefault(h.pipeline, set()).update(h.slots)
        else:
            entries = stages.setdefault(h.pipeline, [])
            if (h.step, h.stage, h.slots) not in entries:
                entries.append((h.step, h.stage, h.slots))
    for name, slots in rollout.items():
        stages.setdefault(name, []).append((-1, ROLLOUT, tuple(sorted(slots))))
    running = {name: tuple(entries) for name, entries in stages.items()}
    holds.running_cache = (holds.version, running)
    return running


def build_snapshot(
    *, now_s: float, holds: SlotHolds, pipelines: Sequence[PipelineProgress], view: ExecutorView
) -> Snapshot:
    """The snapshot of the pool now; ``pipelines`` in index order. With ``view.replicas`` ``None`` only the basic
    fields are filled (what static placements decide on)."""
    running = running_by_pipeline(holds)
    train = view.train_slots or {}
    views = []
    for ps in pipelines:
        mine = running.get(ps.name, ())
        views.append(
            PipelineView(
                name=ps.name,
                index=ps.index,
                arrival_s=ps.arrival_s,
                arrived=ps.arrived,
                started=bool(ps.status),
                finished=ps.finished,
                version=ps.version,
                steps_done=ps.steps_done,
                running=mine,
                rollout_gpus=frozenset(g for st, stage, slots in mine if stage == ROLLOUT for g in slots),
                running_since_s=tuple(ps.running_since(st, stage, now_s) for st, stage, _ in mine),
                train_gpus=train.get(ps.name, ()),
            )
        )
    basic = dict(
        now_s=now_s,
        num_gpus=holds.num_slots,
        gpus_per_node=holds.slots_per_node,
        free_gpus=frozenset(holds.free_slots()),
        ready=view.ready,
        pipelines=tuple(views),
        last_pipeline=tuple(holds.last),
    )
    if view.replicas is None:
        return Snapshot(**basic)
    leases = _leases(holds, view.replica_of or {})
    return Snapshot(**basic, leases=leases, free_bytes=view.free_bytes, replicas=view.replicas, history=view.history)


def _leases(holds: SlotHolds, replica_of: dict) -> tuple:
    """Per slot, its holds as :class:`Lease` s; rebuilt only when the holds or the replica ids changed since the
    pool's last snapshot (a decision is taken at every event, and most events change neither)."""
    cached = holds.lease_cache
    if cached is not None and cached[0] == holds.version and cached[1] == replica_of:
        return cached[2]
    leases = tuple(
        tuple(
            Lease(
                pipeline=h.pipeline,
                stage=h.stage,
                sm_share=h.shares[g],
                replica=replica_of.get(g) if h.stage == ROLLOUT else None,
            )
            for h in holds.on(g)
        )
        for g in range(holds.num_slots)
    )
    holds.lease_cache = (holds.version, dict(replica_of), leases)
    return leases
