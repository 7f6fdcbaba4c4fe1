"""The pool's nodes: one placement rule for the simulator, the live executor and the launcher's pre-Ray check.

A pool is ``nodes x slots_per_node`` slots numbered node-major (verl's own numbering across its per-node placement
groups). A pipeline's home is a contiguous run starting at a multiple of its rollout TP, so no rollout replica ever
straddles two nodes, while its FSDP group may span them; a node that dies takes the pipelines living on it out of
the group and its slots out of the pool.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import replace

import pytest
from test_live_executor_on_cpu import _spec

from jigsaw_verl.model.graph import ROLLOUT
from jigsaw_verl.model.slots import CPU_SLOT
from jigsaw_verl.model.spec import ClusterSpec, WorkloadSpec
from jigsaw_verl.model.topology import (
    PoolTopology,
    home_runs,
    pick_home,
    place_homes,
    placement_refusal,
    replica_groups,
)
from jigsaw_verl.policy.interface import ExecutionMode, SchedulerOutput, StartStage
from jigsaw_verl.runtime.executor import LiveExecutor, PoolTooSmall
from jigsaw_verl.runtime.live_policy import live_policy_factory
from jigsaw_verl.runtime.live_view import replica_slots
from jigsaw_verl.sim.simulator import SimulationError, Simulator


def test_homes_keep_every_rollout_replica_on_one_node_and_may_span_nodes_for_fsdp():
    four = PoolTopology.of_nodes(2, 4)  # slots 0-3 on node 0, 4-7 on node 1
    assert [four.node_of(g) for g in range(8)] == [0] * 4 + [1] * 4
    assert home_runs(2, 2, four) == [(0, 1), (2, 3), (4, 5), (6, 7)]  # TP 2: never (3, 4)
    assert pick_home([(0, 1, 2, 3)], 4, 2, four) == (4, 5, 6, 7)
    assert pick_home([(0, 1)], 4, 2, four) == (4, 5, 6, 7)  # fewest pipelines first
    assert pick_home([(0, 1, 2, 3), (4, 5, 6, 7)], 2, 2, four) == (0, 1)  # then the lowest
    assert pick_home([(0, 1, 2, 3, 4, 5)], 2, 2, four) == (6, 7)
    assert pick_home([(0,), (1,), (2,), (5,)], 2, 1, four) == (6, 7)  # as free, on one node
    assert pick_home([(0,), (1,), (2,), (5,), (6,)], 2, 1, four) == (3, 4)  # a TP-1 run may span nodes (FSDP)
    assert pick_home([], 6, 2, four) == (0, 1, 2, 3, 4, 5)  # wider than a node: spans, replicas aligned
    assert pick_home([], 2, 1, four, lost=frozenset(range(4))) == (4, 5)  # never on a lost node
    assert pick_home([], 2, 8, four) is None
    assert "rollout TP 8 does not divide the pool's 4 slots per node (2 node(s) x 4 slot(s))" in placement_refusal(
        2, 8, four
    )
    assert "more than the pool's 8" in placement_refusal(16, 1, four)
    with pytest.raises(ValueError, match=r"would straddle nodes \(0, 1\)"):
        replica_groups((2, 3, 4, 5), 4, four)
    with pytest.raises(ValueError, match="cannot be cut into nodes of 3 slots"):
        PoolTopology(8, 3)


@pytest.mark.parametrize("seed", range(3))
def test_any_group_places_each_replica_on_one_node(seed):
    """Random pools and pipelines: every home :func:`place_homes` gives is a run of its width, each replica of it
    on one node; a pipeline is homeless only when no aligned run exists at all."""
    rng = random.Random(seed)
    for _ in range(200):
        topology = PoolTopology.of_nodes(rng.choice([1, 2, 3, 4]), rng.choice([1, 2, 4, 8]))
        tps = [t for t in (1, 2, 4, 8) if topology.slots_per_node % t == 0]
        needs = []
        for _ in range(rng.randint(1, 5)):
            tp = rng.choice(tps)
            needs.append((tp * rng.randint(1, max(1, topology.num_slots // tp)), tp))
        for (width, tp), home in zip(needs, place_homes(needs, topology), strict=True):
            assert home is not None and len(home) == width and home[0] % tp == 0
            assert all(len(topology.nodes_of(r)) == 1 for r in replica_groups(home, tp, topology))


def test_the_live_executor_places_by_node_and_a_lost_node_ends_only_the_pipelines_living_there():
    """Three pipelines on 3 nodes x 1 slot (the CPU multi-node run's shape): a and b span two nodes each, c has
    one slot; the executor's homes are the pool rule's; node 2 dies: b (on it) leaves naming the node, a and c
    stay, node 2's slot is never free again and a newcomer cannot be placed on it."""
    topology = PoolTopology.of_nodes(3, 1)
    ex = LiveExecutor(3, CPU_SLOT, live_policy_factory("jigsaw"), policy_name="jigsaw", topology=topology)
    for name, slots in (("a", 2), ("b", 2), ("c", 1)):
        ex.join(_spec(name), slots, 0.0)
    homes = {name: ex.home(name) for name in "abc"}
    assert list(homes.values()) == place_homes([(2, 1), (2, 1), (1, 1)], topology) == [(0, 1), (1, 2), (0,)]
    assert ex.policy() is not None and ex.snapshot(0.0).gpus_per_node == 1
    ex.request("b", 0, ROLLOUT, 0.0)
    assert ex.pipes["b"].running
    ex.lose_node(2, 1.0)
    assert ex.left == {"b": "node 2 lost"} and sorted(ex.pipes) == ["a", "c"]
    assert ex.free_slots() == [0, 1] and 2 not in ex.snapshot(1.0).free_gpus
    with pytest.raises(PoolTooSmall, match=r"no home of 3 slots: .*slots \[2\] are on lost nodes"):
        ex.join(_spec("d"), 3, 2.0)
    with pytest.raises(PoolTooSmall, match="rollout TP 2 does not divide the pool's 1 slots per node"):
        ex.join(replace(_spec("e"), rollout_tp=2), 2, 2.0)


def test_pipelines_live_where_the_launcher_placed_them_whatever_order_they_join_in():
    """The launcher places the group in its order (the group check's placement) and reserves those homes: the
    pipelines joining in another order get them; a planned home that no longer fits is picked anew."""
    topology = PoolTopology.of_nodes(3, 1)
    planned = dict(zip("abc", place_homes([(2, 1), (2, 1), (1, 1)], topology), strict=True))
    ex = LiveExecutor(3, CPU_SLOT, live_policy_factory("jigsaw"), policy_name="jigsaw", topology=topology)
    ex.plan_homes(planned)
    for name, slots in (("c", 1), ("b", 2), ("a", 2)):
        ex.join(_spec(name), slots, 0.0)
    assert {name: ex.home(name) for name in "abc"} == planned == {"a": (0, 1), "b": (1, 2), "c": (0,)}
    ex.leave("b", 1.0)
    ex.lose_node(0, 1.0)
    ex.plan_homes({"d": (0, 1)})  # on the lost node now
    ex.join(_spec("d"), 1, 2.0)
    assert ex.home("d") == (1,)


class _Placed(Exception):
    """Stops the simulation once every rollout has started."""


class _RolloutOnTheHomes:
    """A test policy (the unit under test is the placement): each pipeline's first rollout on the home the pool
    rule gives it; the next decision stops the simulation."""

    name = config = "test-rollout-on-homes"

    def __init__(self, homes: dict[str, tuple[int, ...]]):
        self.homes, self.started = homes, set()

    def mode(self, pipeline):
        return ExecutionMode()

    def schedule(self, snap):
        if len(self.started) == len(self.homes):
            raise _Placed
        todo = [r for r in snap.ready if r.stage == ROLLOUT and r.pipeline not in self.started]
        if not todo or any(g not in snap.free_gpus for g in self.homes[todo[0].pipeline]):
            return SchedulerOutput(())
        self.started.add(todo[0].pipeline)
        return SchedulerOutput((StartStage(todo[0].pipeline, 0, ROLLOUT, self.homes[todo[0].pipeline]),))


def test_the_simulator_and_the_live_executor_place_the_same_workload_alike():
    """A workload of two nodes x 4 slots: TP-2 pipelines of 4, 2 and 2 slots. The live executor's homes are the
    pool rule's; the simulator, running a rollout on each home, builds its replicas on the very slots the live
    executor maps replica ranks to (two slots each, none across the nodes), and a plan that would put a TP-2
    replica across the nodes is refused by the simulator as by the pool rule."""
    specs = tuple(replace(_spec(n), rollout_tp=2) for n in "abc")
    widths = {"a": 4, "b": 2, "c": 2}
    topology = PoolTopology.of_nodes(2, 4)
    ex = LiveExecutor(8, CPU_SLOT, live_policy_factory("greedy"), policy_name="greedy", topology=topology)
    for spec in specs:
        ex.join(spec, widths[spec.name], 0.0)
    homes = {s.name: ex.home(s.name) for s in specs}
    assert list(homes.values()) == place_homes([(widths[s.name], 2) for s in specs], topology)
    assert homes == {"a": (0, 1, 2, 3), "b": (4, 5), "c": (6, 7)}
    live = {}
    for spec in specs:
        (grant,) = ex.request(spec.name, 0, ROLLOUT, 0.0)
        live[spec.name] = sorted(replica_slots(ex.pipes[spec.name], grant).values())
    cluster = ClusterSpec(gpu=CPU_SLOT, num_gpus=8, gpus_per_node=4)
    workload = WorkloadSpec(name="two-nodes", seed=0, cluster=cluster, pipelines=specs)
    sim = Simulator(workload, _RolloutOnTheHomes(homes))
    with pytest.raises(_Placed):
        sim.run()
    simulated = {s.name: sorted(e.gpus for e in sim.engines if e.pipeline == s.name) for s in specs}
    assert simulated == live == {"a": [(0, 1), (2, 3)], "b": [(4, 5)], "c": [(6, 7)]}
    straddling = Simulator(workload, _RolloutOnTheHomes({"a": (1, 2, 3, 4), "b": (5, 6), "c": (0, 7)}))
    with pytest.raises(SimulationError, match=r"rollout of a: a TP-2 rollout replica on slots \(3, 4\) would straddle"):
        straddling.run()
    assert all(len(topology.nodes_of(g)) == 1 for g in itertools.chain(*simulated.values()))
