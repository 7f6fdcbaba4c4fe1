"""The group's pool as placement: the shape of one slot's Ray bundle, and the record a pipeline receives.

Kept free of verl so the scheduler actor and the launcher do not import it; :mod:`.shared_pool` hands the record to
verl's resource pool classes.
"""

from __future__ import annotations

from dataclasses import dataclass

# verl's ResourcePoolManager.max_colocate_count: the worker groups one pipeline may colocate on a slot
VERL_COLOCATE = 3


def pool_bundle(device_resource: str, max_colocate_count: int) -> dict[str, float]:
    """One slot's bundle, as verl's ``RayResourcePool.get_placement_groups`` builds it (on the CPU platform the
    device resource is ``CPU`` itself, so a slot is one CPU)."""
    bundle = {"CPU": float(max_colocate_count)}
    bundle[device_resource] = 1.0
    return bundle


@dataclass(frozen=True)
class PoolPlacement:
    """The group's pool as a pipeline receives it from the scheduler.

    Args:
        placement_group: the pool's Ray placement group (one bundle per slot, one node).
        max_colocate_count: verl's colocation count every pipeline of the group uses, so each of its workers takes
            ``1 / max_colocate_count`` of a slot: ``VERL_COLOCATE`` times the most pipelines the group holds.
        num_slots: bundles in the pool.
        first_slot: the bundle of the pipeline's rank 0 (its ranks take the bundles from there on: its home).
    """

    placement_group: object
    max_colocate_count: int
    num_slots: int
    first_slot: int = 0
