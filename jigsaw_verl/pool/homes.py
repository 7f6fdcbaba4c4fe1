"""Where a live pipeline's workers live in the pool (its *home*), and whether the pipelines sharing a slot fit there.

A verl pipeline places its workers once, rank ``r`` on slot ``home[r]``; its rollout engines live there too (verl's
hybrid engine). The live executor picks each home at join with :func:`~jigsaw_verl.model.topology.pick_home` (node
aware); the pre-Ray group check (:func:`group_memory_refusal`) places the group's pipelines with the same rule, in
the order the launcher starts them, and applies the slot memory rule
(:func:`~jigsaw_verl.model.engine_memory.slot_memory_refusal`) to every slot.
"""

from __future__ import annotations

from collections.abc import Sequence

from jigsaw_verl.model.engine_memory import EngineReservation, slot_memory_refusal
from jigsaw_verl.model.topology import PoolTopology, place_homes


def sharing_refusal(placed: dict[tuple[int, ...], list[EngineReservation]], memory_bytes: float) -> str | None:
    """The first slot memory refusal of the pipelines living at the keys of ``placed`` (home -> reservations)."""
    by_slot: dict[int, list[EngineReservation]] = {}
    for home, reservations in placed.items():
        for g in home:
            by_slot.setdefault(g, []).extend(reservations)
    for slot in sorted(by_slot):
        refusal = slot_memory_refusal(by_slot[slot], memory_bytes, slot)
        if refusal:
            return refusal
    return None


def group_homes(
    reservations: list[EngineReservation], tps: Sequence[int], topology: PoolTopology
) -> list[tuple[int, ...] | None]:
    """The homes of ``reservations`` (rollout TPs ``tps``) joining in order, by the pool rule; ``None`` for one
    that cannot be placed."""
    return place_homes(
        [(min(r.slots, topology.num_slots), tp) for r, tp in zip(reservations, tps, strict=True)], topology
    )


def group_memory_refusal(
    reservations: list[EngineReservation], tps: Sequence[int], topology: PoolTopology, memory_bytes: float
) -> str | None:
    """Place ``reservations`` (rollout TPs ``tps``) in order (:func:`group_homes`) and return the first placement
    or slot memory refusal, if any."""
    placed: dict[tuple[int, ...], list[EngineReservation]] = {}
    for r, tp, home in zip(reservations, tps, group_homes(reservations, tps, topology), strict=True):
        if home is None:
            return f"pipeline {r.pipeline!r}: no home of {r.slots} slots at rollout TP {tp} on {topology.describe()}"
        placed.setdefault(home, []).append(r)
    return sharing_refusal(placed, memory_bytes)
