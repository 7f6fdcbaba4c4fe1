"""A holder's side of the CPU backend's device-memory ledger: which ranks' slots its bytes are on, and the calls.

A process placed in the group's pool (a verl worker) finds its pool in Ray's runtime context (the placement group it
runs in, whose name carries the group's) and its rank in verl's ``RANK``; the ledger knows on which slot each rank
of the pipeline lives. A rollout server is not placed in the pool (it takes no Ray resources); its replica asks its
workers and hands the result to the server. Outside a pool with a ledger (a run alone, or on GPUs) there is nothing
to charge: :func:`slot_memory_of_this_worker` returns ``None``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import ray

from jigsaw_verl.pool.ledger import DeviceOutOfMemory
from jigsaw_verl.runtime.ledger_actor import find_ledger, group_of_placement_group


@dataclass(frozen=True)
class SlotMemory:
    """Where a holder's device memory is charged.

    Attributes:
        group: the group whose pool holds the slots, which names its ledger.
        ranks: the worker ranks on whose slots the holder's bytes are, each charged in full (a tensor-parallel
            replica reserves on each of its GPUs).
        job_id: the holder's Ray job, which the ledger knows as its pipeline.
    """

    group: str
    ranks: tuple[int, ...]
    job_id: str

    def _ledger(self):
        ledger = find_ledger(self.group)
        if ledger is None:
            raise RuntimeError(f"the device-memory ledger of group {self.group!r} is gone")
        return ledger

    def capacity(self) -> float:
        """One slot's device memory, bytes."""
        return ray.get(self._ledger().capacity.remote())

    def charge(self, holder: str, nbytes: float, *, startup: bool = False) -> None:
        """``holder`` holds ``nbytes`` on each of its slots from now; ``startup``: first fail as vLLM's start-up
        check does when a slot's free memory is below ``nbytes``. Raises :class:`DeviceOutOfMemory`."""
        ledger = self._ledger()
        for rank in self.ranks:
            if startup:
                _unwrap(ledger.check_free.remote(self.job_id, rank, holder, nbytes))
            _unwrap(ledger.charge.remote(self.job_id, rank, holder, nbytes))

    async def charge_async(self, holder: str, nbytes: float) -> None:
        """:meth:`charge` from an asyncio actor (a rollout server)."""
        ledger = self._ledger()
        for rank in self.ranks:
            try:
                await ledger.charge.remote(self.job_id, rank, holder, nbytes)
            except ray.exceptions.RayTaskError as err:
                _raise_out_of_memory(err)

    def release(self, holder: str) -> None:
        """``holder`` holds nothing on its slots any more."""
        ledger = self._ledger()
        ray.get([ledger.release.remote(self.job_id, rank, holder) for rank in self.ranks])

    async def release_async(self, holder: str) -> None:
        """:meth:`release` from an asyncio actor."""
        ledger = self._ledger()
        for rank in self.ranks:
            await ledger.release.remote(self.job_id, rank, holder)


def _unwrap(ref) -> None:
    """Wait for a ledger call; its :class:`DeviceOutOfMemory` is raised itself (as CUDA's allocator raises)."""
    try:
        ray.get(ref)
    except ray.exceptions.RayTaskError as err:
        _raise_out_of_memory(err)


def _raise_out_of_memory(err: Exception) -> None:
    if isinstance(err.cause, DeviceOutOfMemory):
        raise DeviceOutOfMemory(str(err.cause)) from None
    raise err


def slot_memory_of_this_worker() -> SlotMemory | None:
    """The calling worker's place in its pool's ledger (its verl ``RANK``), or ``None`` when it runs in no pool
    with a ledger."""
    context = ray.get_runtime_context()
    group = group_of_placement_group(context.get_placement_group_id())
    if group is None or find_ledger(group) is None:
        return None
    return SlotMemory(group, (int(os.environ.get("RANK", "0")),), context.get_job_id())


def one_holder(found: list[SlotMemory | None]) -> SlotMemory | None:
    """The slots of a replica's workers (each one's :func:`slot_memory_of_this_worker`) as one holder's; ``None``
    outside a pool with a ledger."""
    if not found or any(f is None for f in found):
        return None
    return SlotMemory(found[0].group, tuple(r for f in found for r in f.ranks), found[0].job_id)
