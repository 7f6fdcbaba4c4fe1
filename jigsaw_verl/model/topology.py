"""The pool's shape: nodes of slots, and the placement rules both executors share.

A group's pool is ``nodes x slots_per_node`` slots numbered node-major: slot ``g`` is bundle ``g % slots_per_node``
of node ``g // slots_per_node``. That is verl's own numbering across its per-node placement groups
(``SubRayResourcePool`` puts rank ``r`` in placement group ``r // process_on_nodes[0]``, bundle
``r % process_on_nodes[0]``: ``_init_with_subresource_pool`` in ``verl/single_controller/ray/base.py``), so a
pipeline placed from slot ``first`` on gets exactly the slots this module says.

Rules (the simulator, the policies, the live executor and the launcher's pre-Ray check all apply them through this
module):

- a rollout replica's ``tp`` slots are on one node (verl starts one server per replica node, on the node of the
  replica's first worker: ``vllm_async_server.py``; TP groups talk over NVLink);
- a pipeline's home is a contiguous run of slots starting at a multiple of its rollout TP, so every replica in it
  stays on one node; the run may span nodes (an FSDP group may, as in verl);
- among the runs, the one the fewest pipelines already live on, then the one on the fewest nodes, then the lowest.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class PoolTopology:
    """A pool of ``num_slots`` slots on nodes of ``slots_per_node`` each.

    Args:
        num_slots: slots (GPUs) in the pool.
        slots_per_node: slots on each node (a whole number of nodes).
    """

    num_slots: int
    slots_per_node: int

    def __post_init__(self):
        if self.num_slots < 1 or self.slots_per_node < 1 or self.num_slots % self.slots_per_node:
            raise ValueError(
                f"a pool of {self.num_slots} slots cannot be cut into nodes of {self.slots_per_node} slots"
            )

    @classmethod
    def of_nodes(cls, nodes: int, slots_per_node: int) -> PoolTopology:
        return cls(nodes * slots_per_node, slots_per_node)

    @property
    def nodes(self) -> int:
        return self.num_slots // self.slots_per_node

    def node_of(self, slot: int) -> int:
        return slot // self.slots_per_node

    def node_slots(self, node: int) -> range:
        return range(node * self.slots_per_node, (node + 1) * self.slots_per_node)

    def nodes_of(self, slots: Iterable[int]) -> tuple[int, ...]:
        """The nodes ``slots`` are on, ascending."""
        return tuple(sorted({self.node_of(g) for g in slots}))

    def describe(self) -> str:
        return f"{self.nodes} node(s) x {self.slots_per_node} slot(s)"


def topology_of(snap) -> PoolTopology:
    """The pool's shape in a policy's :class:`~jigsaw_verl.policy.interface.Snapshot` (``gpus_per_node`` 0: one
    node)."""
    return PoolTopology(snap.num_gpus, snap.gpus_per_node or snap.num_gpus)


def replica_groups(slots: Sequence[int], tp: int, topology: PoolTopology) -> list[tuple[int, ...]]:
    """``slots`` cut into rollout replicas of ``tp`` consecutive slots each (verl's replica ``r`` on workers
    ``r * tp`` to ``(r + 1) * tp - 1``); ``ValueError`` when they do not divide or a replica would straddle nodes."""
    if tp < 1 or len(slots) % tp:
        raise ValueError(f"{len(slots)} slots cannot hold rollout replicas of TP {tp}")
    groups = [tuple(slots[i : i + tp]) for i in range(0, len(slots), tp)]
    for group in groups:
        if len(topology.nodes_of(group)) > 1:
            raise ValueError(
                f"a TP-{tp} rollout replica on slots {group} would straddle nodes {topology.nodes_of(group)} of a "
                f"pool of {topology.describe()}"
            )
    return groups


def whole_replicas(slots, tp: int, topology: PoolTopology) -> list[int]:
    """Of ``slots``, as many as make whole rollout replicas of ``tp`` slots on one node each, node by node and lowest
    first, in an order whose consecutive runs of ``tp`` are those replicas (what :func:`replica_groups` carves)."""
    by_node: dict[int, list[int]] = {}
    for g in sorted(slots):
        by_node.setdefault(topology.node_of(g), []).append(g)
    out: list[int] = []
    for node in sorted(by_node):
        on = by_node[node]
        out += on[: len(on) // tp * tp]
    return out


def placement_refusal(width: int, tp: int, topology: PoolTopology) -> str | None:
    """Why a pipeline of ``width`` slots and rollout TP ``tp`` can never be placed on ``topology``, or ``None``."""
    if tp < 1 or topology.slots_per_node % tp:
        per_node = topology.slots_per_node
        return f"rollout TP {tp} does not divide the pool's {per_node} slots per node ({topology.describe()})"
    if width > topology.num_slots:
        return f"{width} slots is more than the pool's {topology.num_slots} ({topology.describe()})"
    if width % tp:
        return f"{width} slots cannot hold rollout replicas of TP {tp}"
    return None


def home_runs(width: int, tp: int, topology: PoolTopology, lost: frozenset[int] = frozenset()) -> list[tuple[int, ...]]:
    """Every home of ``width`` slots a pipeline of rollout TP ``tp`` may take: contiguous runs starting at a
    multiple of ``tp``, none on a ``lost`` slot (a node that left the pool)."""
    if placement_refusal(width, tp, topology):
        return []
    runs = (tuple(range(s, s + width)) for s in range(0, topology.num_slots - width + 1, tp))
    return [run for run in runs if not lost.intersection(run)]


def pick_home(
    homes: Iterable[tuple[int, ...]],
    width: int,
    tp: int,
    topology: PoolTopology,
    lost: frozenset[int] = frozenset(),
) -> tuple[int, ...] | None:
    """The home of a pipeline of ``width`` slots and rollout TP ``tp`` beside pipelines living at ``homes``: of
    :func:`home_runs`, the one the fewest of them live on, then on the fewest nodes, then the lowest; ``None`` when
    none exists."""
    load = [0] * topology.num_slots
    for home in homes:
        for g in home:
            load[g] += 1
    runs = home_runs(width, tp, topology, lost)
    if not runs:
        return None
    return min(runs, key=lambda run: (sum(load[g] for g in run), len(topology.nodes_of(run)), run[0]))


def place_homes(needs: Sequence[tuple[int, int]], topology: PoolTopology) -> list[tuple[int, ...] | None]:
    """Homes of pipelines joining in order, each ``(width, tp)`` (:func:`pick_home` over those placed before)."""
    placed: list[tuple[int, ...]] = []
    out: list[tuple[int, ...] | None] = []
    for width, tp in needs:
        home = pick_home(placed, width, tp, topology)
        out.append(home)
        if home is not None:
            placed.append(home)
    return out
