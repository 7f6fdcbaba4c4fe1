"""Pool slots that behave like devices on the CPU: every process placed on a slot runs on that slot's own cores.

Switched on per pipeline by ``jigsaw.mux.pin_cores=true`` (``jigsaw-verl mux --pin-cores``), which sets
:data:`PIN_CORES_ENV` for every Ray worker of its job. A GPU kernel cannot borrow another GPU's SMs; without this,
a stage on slot 0 of a CPU pool would borrow slot 1's core whenever slot 1 idles, and a multiplexed run would gain
(or lose) what no GPU pool could. So each verl worker is pinned, with every thread it has, to the cores of the slot
it was placed on, and each rollout server to the cores of its replica's workers' slots (``CPURolloutReplica`` pins
both when it launches its server).

Which cores: global slot ``g`` (slot ``b`` of node ``k``'s placement group, ``g = k * slots_per_node + b``) takes
the ``g``-th run of ``per`` consecutive cores of the machine, ``per = max(1, cores // slots_per_node)``, wrapping
round when a machine has fewer cores than slots (then two slots share a core, and the README says so). One slot a
node takes the node's cores.

What this models: a stage's compute is confined to its slot, as on a GPU; stages of two pipelines on one slot
time-share its cores (the OS's scheduler), which is how the CPU shows co-location. What it does not: SM shares
(``sm_share`` is not enforced), memory bandwidth, and the helpers verl keeps beside the trainer (task runner,
agent-loop and reward workers, TransferQueue) run on any core, as on a GPU node they run on its host CPUs.
"""

from __future__ import annotations

import os

import ray

from jigsaw_verl.integration.lease_client import bundle_index
from jigsaw_verl.runtime.pool_placement import NODE_INFIX, group_of_pool_name

# set to "1" in a job's workers when its pipeline pins its slots (jigsaw.mux.pin_cores)
PIN_CORES_ENV = "JIGSAW_VERL_PIN_CORES"
# the cores this process could run on when it started (before any pinning), in order
MACHINE_CORES: tuple[int, ...] = tuple(sorted(os.sched_getaffinity(0)))


def slot_cores(slot: int, slots_per_node: int, cores: tuple[int, ...] = MACHINE_CORES) -> tuple[int, ...]:
    """The cores of global pool slot ``slot`` on a machine with ``cores`` (see the module's docstring)."""
    if slot < 0 or slots_per_node < 1 or not cores:
        raise ValueError(f"slot {slot} of {slots_per_node} per node on cores {cores}: no such slot")
    per = max(1, len(cores) // slots_per_node)
    first = (slot * per) % len(cores)
    return tuple(cores[(first + i) % len(cores)] for i in range(per))


def pin_process(cores: tuple[int, ...]) -> None:
    """Run every thread of this process (and the threads it starts later) on ``cores``; torch's intra-op pool
    takes one thread per core."""
    import torch

    for task in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(task), cores)
        except (ProcessLookupError, PermissionError):  # a thread that ended meanwhile
            continue
    torch.set_num_threads(len(cores))


def this_workers_slot_cores() -> tuple[int, ...] | None:
    """The cores of the pool slot the calling verl worker was placed on; ``None`` outside a group's pool."""
    context = ray.get_runtime_context()
    pg_hex, bundle = context.get_placement_group_id(), bundle_index(context)
    if not pg_hex or bundle is None:
        return None
    from ray._raylet import PlacementGroupID
    from ray.util.placement_group import PlacementGroup, placement_group_table

    table = placement_group_table(PlacementGroup(PlacementGroupID.from_hex(pg_hex)))
    name = table.get("name") or ""
    if group_of_pool_name(name) is None:
        return None
    node = int(name.rsplit(NODE_INFIX, 1)[1])
    slots_per_node = len(table["bundles"])
    return slot_cores(node * slots_per_node + bundle, slots_per_node)


def pin_this_worker(worker=None) -> tuple[int, ...] | None:
    """Pin the calling verl worker to its slot's cores (run in the worker, e.g. through ``__ray_call__``, whose
    first argument is the worker); returns them, or ``None`` (nothing pinned) outside a group's pool or when its
    pipeline does not pin (:data:`PIN_CORES_ENV`)."""
    if os.environ.get(PIN_CORES_ENV) != "1":
        return None
    cores = this_workers_slot_cores()
    if cores is not None:
        pin_process(cores)
    return cores
