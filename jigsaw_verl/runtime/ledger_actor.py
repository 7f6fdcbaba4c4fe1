"""The group's device-memory ledger as a Ray actor, found by the pool's placement group.

On the CPU backend the group's scheduler makes one beside the pool's placement groups (:meth:`MuxScheduler.pool`):
a GPU enforces memory, the CPU does not, so every holder of what a GPU would hold charges this ledger. A holder
knows only the placement group it runs in (Ray's runtime context), its Ray job and its rank in its worker group, so
the ledger is named by the group (:func:`ledger_name`), which the name of each of the pool's placement groups
carries (:func:`group_of_placement_group`), and learns which pipeline a job is, and which
slots its ranks are on (rank ``r`` in slot ``home[r]``, as verl places them), when the pipeline receives the pool
(:meth:`LedgerActor.register`). A charge that does not fit raises
:class:`~jigsaw_verl.pool.ledger.DeviceOutOfMemory` in the holder. On a GPU there is no ledger: the device itself
fails.
"""

from __future__ import annotations

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from jigsaw_verl.pool.ledger import DeviceLedger
from jigsaw_verl.runtime.pool_placement import group_of_pool_name

# the Ray namespace of the group's actors (its scheduler and ledger)
NAMESPACE = "jigsaw_mux"


def ledger_name(group: str) -> str:
    """The Ray actor name of the ledger of ``group``'s pool."""
    return f"jigsaw-ledger-{group}"


def group_of_placement_group(placement_group_hex: str | None) -> str | None:
    """The group whose pool the placement group ``placement_group_hex`` is a node of, or ``None``."""
    if not placement_group_hex:
        return None
    from ray._raylet import PlacementGroupID
    from ray.util.placement_group import PlacementGroup, placement_group_table

    pg = PlacementGroup(PlacementGroupID.from_hex(placement_group_hex))
    return group_of_pool_name(placement_group_table(pg).get("name") or "")


class LedgerActor:
    """A :class:`~jigsaw_verl.pool.ledger.DeviceLedger` that holders reach by their Ray job and rank.

    Args:
        num_slots: slots in the pool.
        capacity_bytes: one slot's device memory, bytes.
        t0: the scheduler's monotonic start (the timeline then shares the leases' clock).
    """

    def __init__(self, num_slots: int, capacity_bytes: float, t0: float):
        self.ledger = DeviceLedger(num_slots, capacity_bytes, t0=t0)
        self.jobs: dict[str, tuple[str, tuple[int, ...]]] = {}

    def register(self, job_id: str, pipeline: str, home: list[int]) -> None:
        """Ray job ``job_id`` is pipeline ``pipeline`` (its driver, trainer, workers and servers); its rank ``r``
        lives on slot ``home[r]``."""
        self.jobs[job_id] = (pipeline, tuple(home))

    def capacity(self) -> float:
        return self.ledger.capacity

    def charge(self, job_id: str, rank: int, holder: str, nbytes: float) -> None:
        self.ledger.charge(*self._where(job_id, rank), holder, nbytes)

    def release(self, job_id: str, rank: int, holder: str) -> None:
        self.ledger.release(*self._where(job_id, rank), holder)

    def check_free(self, job_id: str, rank: int, holder: str, nbytes: float) -> None:
        self.ledger.check_free(*self._where(job_id, rank), holder, nbytes)

    def release_pipeline(self, pipeline: str) -> None:
        self.ledger.release_pipeline(pipeline)

    def slot_bytes(self) -> list[float]:
        """What each slot holds now, bytes."""
        return [self.ledger.slot_bytes(s) for s in range(len(self.ledger.held))]

    def timeline(self) -> dict:
        return self.ledger.timeline()

    def _where(self, job_id: str, rank: int) -> tuple[int, str]:
        """``(slot, pipeline)`` of rank ``rank`` of job ``job_id``."""
        if job_id not in self.jobs:
            raise LookupError(f"Ray job {job_id} charges the device-memory ledger but joined no pipeline of the group")
        pipeline, home = self.jobs[job_id]
        if not 0 <= rank < len(home):
            raise LookupError(f"pipeline {pipeline!r} has {len(home)} ranks on the pool; rank {rank} charged memory")
        return home[rank], pipeline


def create_ledger(group: str, num_slots: int, capacity_bytes: float, t0: float):
    """Make ``group``'s ledger actor on the caller's node (owned by the caller: it ends with the group's scheduler,
    and a node leaving the cluster never takes it)."""
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    return (
        ray.remote(LedgerActor)
        .options(name=ledger_name(group), namespace=NAMESPACE, num_cpus=0, scheduling_strategy=here)
        .remote(num_slots, capacity_bytes, t0)
    )


def find_ledger(group: str | None):
    """``group``'s ledger, or ``None`` (no such group, or a GPU pool)."""
    if not group:
        return None
    try:
        return ray.get_actor(ledger_name(group), namespace=NAMESPACE)
    except ValueError:
        return None
