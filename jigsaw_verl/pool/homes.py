"""Where a live pipeline's workers live in the pool (its *home*), and whether the pipelines sharing a slot fit there.

A verl pipeline places its workers once, rank ``r`` on slot ``home[r]``; its rollout engines live there too (verl's
hybrid engine). The live executor picks each home at join with :func:`pick_home`; the pre-Ray group check
(:func:`group_memory_refusal`) places the group's pipelines with the same rule, in the order the launcher starts
them, and applies the slot memory rule (:func:`~jigsaw_verl.model.engine_memory.slot_memory_refusal`) to every slot.
"""

from __future__ import annotations

from jigsaw_verl.model.engine_memory import EngineReservation, slot_memory_refusal


def pick_home(homes: list[tuple[int, ...]], slots: int, num_slots: int) -> tuple[int, ...]:
    """The contiguous run of ``slots`` of ``num_slots`` slots the fewest of the pipelines living at ``homes`` live on
    (the lowest such run)."""
    load = [0] * num_slots
    for home in homes:
        for g in home:
            load[g] += 1
    start = min(range(num_slots - slots + 1), key=lambda s: (sum(load[s : s + slots]), s))
    return tuple(range(start, start + slots))


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


def group_memory_refusal(reservations: list[EngineReservation], num_slots: int, memory_bytes: float) -> str | None:
    """Place ``reservations`` in order with :func:`pick_home` and return the first slot memory refusal, if any."""
    placed: dict[tuple[int, ...], list[EngineReservation]] = {}
    homes: list[tuple[int, ...]] = []
    for r in reservations:
        home = pick_home(homes, min(r.slots, num_slots), num_slots)
        homes.append(home)
        placed.setdefault(home, []).append(r)
    return sharing_refusal(placed, memory_bytes)
