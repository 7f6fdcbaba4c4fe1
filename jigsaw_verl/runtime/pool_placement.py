"""The group's pool as placement: the shape of one slot's Ray bundle, and the record a pipeline receives.

Kept free of verl so the scheduler actor and the launcher do not import it; :mod:`.shared_pool` hands the record to
verl's resource pool classes.
"""

from __future__ import annotations

from dataclasses import dataclass

# verl's ResourcePoolManager.max_colocate_count: the worker groups one pipeline may colocate on a slot
VERL_COLOCATE = 3


# what verl's worker-group start-up runs in bundle 0 of its pool besides the workers: a task that asks for one CPU
# (``RayWorkerGroup._get_master_addr_port``, ``verl/single_controller/ray/base.py``)
SETUP_TASK_CPUS = 1.0


def pool_bundle(device_resource: str, max_colocate_count: int) -> dict[str, float]:
    """One slot's bundle, as verl's ``RayResourcePool.get_placement_groups`` builds it: the device plus
    ``max_colocate_count`` host CPUs. On the CPU platform the device resource is ``CPU`` itself and verl's bundle
    is one CPU (the device), which the workers share (``1 / max_colocate_count`` each); here it also has room for
    the start-up task of each pipeline's worker group, which could never be placed beside another pipeline's
    workers in a one-CPU bundle."""
    if device_resource == "CPU":
        return {"CPU": 1.0 + SETUP_TASK_CPUS}
    return {"CPU": float(max_colocate_count), device_resource: 1.0}


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
