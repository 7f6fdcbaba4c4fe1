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


# the name of a pool node's placement group: ``jigsaw-pool-<group>-node<k>`` (a worker finds its group's ledger by it)
POOL_PREFIX, NODE_INFIX = "jigsaw-pool-", "-node"


def pool_group_name(group: str, node: int) -> str:
    """The name of the placement group of node ``node`` of ``group``'s pool."""
    return f"{POOL_PREFIX}{group}{NODE_INFIX}{node}"


def group_of_pool_name(name: str) -> str | None:
    """The group whose pool placement group is named ``name``, or ``None`` (not a pool's)."""
    if not name.startswith(POOL_PREFIX) or NODE_INFIX not in name:
        return None
    group, node = name[len(POOL_PREFIX) :].rsplit(NODE_INFIX, 1)
    return group if node.isdigit() else None


@dataclass(frozen=True)
class PoolPlacement:
    """The group's pool as a pipeline receives it from the scheduler.

    Args:
        placement_groups: the pool's Ray placement groups, one per node in node order (as verl makes one per node),
            ``slots_per_node`` bundles each: slot ``g`` is bundle ``g % slots_per_node`` of group
            ``g // slots_per_node``.
        slots_per_node: bundles (slots) per node.
        max_colocate_count: verl's colocation count every pipeline of the group uses, so each of its workers takes
            ``1 / max_colocate_count`` of a slot: ``VERL_COLOCATE`` times the most pipelines the group holds.
        num_slots: bundles in the pool.
        group: the group's name (its ledger's, on the CPU backend).
        first_slot: the slot of the pipeline's rank 0 (its ranks take the slots from there on: its home).
    """

    placement_groups: tuple
    slots_per_node: int
    max_colocate_count: int
    num_slots: int
    group: str = ""
    first_slot: int = 0
