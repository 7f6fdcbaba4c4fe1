"""A group's pool over two Ray nodes, placed by the group's scheduler and filled by verl's worker groups.

A Ray cluster of a head (no GPUs) and two worker nodes of 2 GPUs each runs on this machine
(:mod:`multi_node_cluster`; Ray gives each node's actors GPU ids 0 and 1 as a real 2-GPU node would, with no
hardware behind them). The group's scheduler makes the pool, 2 nodes x 2 slots, as verl makes its own: one
``STRICT_PACK`` placement group per node. Pipeline a (2 slots, rollout TP 2) is homed on one node; b (4 slots) spans
both. verl's ``RayWorkerGroup`` places them through :class:`SharedPoolManager`, with verl's CUDA platform, and every
worker says where it runs and what verl set in its environment. Then c joins beside b and its trainer's fit raises
(as when its workers on the node died first): it leaves failed. Node 1's raylet is killed: the scheduler notices,
b (living on it) leaves naming the node, c's error names it too, a stays.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import replace

POOL_NODES, SLOTS_PER_NODE = 2, 2


def _probe_multi_node() -> dict:
    import ray
    from multi_node_cluster import ray_cluster
    from test_live_executor_on_cpu import _spec
    from verl.single_controller.base import Worker
    from verl.single_controller.base.decorator import Dispatch, register
    from verl.single_controller.ray.base import RayClassWithInitArgs, RayWorkerGroup

    from jigsaw_verl.integration.shared_pool import SharedPoolManager
    from jigsaw_verl.model.catalogue import GPUS
    from jigsaw_verl.runtime.scheduler import get_scheduler

    class Probe(Worker):
        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def where(self):
            from jigsaw_verl.integration.lease_client import bundle_index

            context = ray.get_runtime_context()
            keys = ("WORLD_SIZE", "RANK", "RAY_LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES")
            return {
                "rank": self.rank,
                "node_id": context.get_node_id(),
                "placement_group": context.get_placement_group_id(),
                "bundle": bundle_index(context),
                "gpu_ids": [str(i) for i in context.get_accelerator_ids().get("GPU", [])],
                "env": {k: os.environ.get(k) for k in keys},
            }

    # a bundle is {"CPU": 3 x 2 pipelines, "GPU": 1}: a worker node has room for its 2 slots and nothing else
    workers = [{"num_cpus": 6 * SLOTS_PER_NODE, "num_gpus": SLOTS_PER_NODE} for _ in range(POOL_NODES)]
    with ray_cluster(head_cpus=8, workers=workers) as (cluster, nodes):
        ray.init(address=cluster.address, log_to_driver=False)
        slots = POOL_NODES * SLOTS_PER_NODE
        scheduler = get_scheduler("multi", slots, GPUS["H100-80G"], "greedy", 2, nodes=POOL_NODES)
        seen = {}
        for name, width in (("a", 2), ("b", 4)):
            ray.get(scheduler.join.remote(replace(_spec(name), rollout_tp=2), width))
        for name, width in (("a", 2), ("b", 4)):
            placement = ray.get(scheduler.pool.remote("GPU", name))
            manager = SharedPoolManager({"global_pool": [width]}, {}, placement, name)
            manager.create_resource_pool()
            group = RayWorkerGroup(
                resource_pool=manager.resource_pool_dict["global_pool"],
                ray_cls_with_init=RayClassWithInitArgs(cls=ray.remote(Probe)),
                device_name="cuda",
            )
            seen[name] = group.where()
        pool = ray.get(scheduler.placement.remote())
        # c, homed beside b, fails by itself before the loss is noticed: trainer mode jigsaw's fit raises (verl's
        # loop raising as when its workers on the node died first) and the pipeline leaves the group
        ray.get(scheduler.join.remote(replace(_spec("c"), rollout_tp=2), 2))
        c_home = ray.get(scheduler.placement.remote())["homes"]["c"]
        _fit_raising(scheduler, "c", ray.exceptions.ActorDiedError())
        victim = next(n for n in nodes if n.node_id == pool["nodes"][1]["node_id"])
        victim.kill_raylet()
        killed = time.monotonic()
        status = ray.get(scheduler.status.remote())
        while "b" not in status["left"] and time.monotonic() - killed < 60:
            time.sleep(0.2)
            status = ray.get(scheduler.status.remote())
        status["noticed_after_s"] = time.monotonic() - killed
        return {"pool": pool, "seen": seen, "status": status, "c_home": c_home}


def _fit_raising(scheduler, pipeline: str, error: Exception) -> None:
    """Trainer mode jigsaw's ``fit`` for ``pipeline`` (its own method, leaving through the real lease client) over
    a verl fit loop that raises ``error`` (a double for the loop, patched on verl's sync trainer for this call)."""
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    from jigsaw_verl.integration.lease_client import StageLeases
    from jigsaw_verl.integration.trainer.v1_jigsaw import JigsawPPOTrainerV1

    leases = object.__new__(StageLeases)  # joined above, holding no lease
    leases.pipeline, leases.scheduler, leases.current, leases.residency = pipeline, scheduler, None, None
    trainer = object.__new__(JigsawPPOTrainerV1)
    trainer._jigsaw_leases = leases

    def verl_fit_raising(self, agent_loop_manager):
        raise error

    original, PPOTrainerSync.fit = PPOTrainerSync.fit, verl_fit_raising
    try:
        trainer.fit(None)
    except type(error):
        pass
    else:
        raise AssertionError("the trainer's fit swallowed its loop's error")
    finally:
        PPOTrainerSync.fit = original


def test_multi_node_pool_places_each_pipeline_by_node_and_a_lost_node_ends_only_its_pipelines():
    env = {k: v for k, v in os.environ.items() if k not in ("VERL_PLATFORM", "RAY_ADDRESS")}
    r = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    found = json.loads(r.stdout.strip().splitlines()[-1])
    pool, seen, status = found["pool"], found["seen"], found["status"]
    # one placement group per node, on two distinct Ray nodes, slots numbered node-major
    assert [n["slots"] for n in pool["nodes"]] == [[0, 1], [2, 3]] and pool["slots_per_node"] == SLOTS_PER_NODE
    assert len({n["node_id"] for n in pool["nodes"]}) == POOL_NODES
    assert pool["homes"] == {"a": [0, 1], "b": [0, 1, 2, 3]}
    node_of_slot = {g: n for n in pool["nodes"] for g in n["slots"]}
    for name, workers in seen.items():
        assert [w["rank"] for w in workers] == list(range(len(workers)))
        master = {(w["env"]["MASTER_ADDR"], w["env"]["MASTER_PORT"]) for w in workers}
        assert len(master) == 1, master  # one rendezvous for the whole FSDP group, across nodes
        for w in workers:
            slot = pool["homes"][name][w["rank"]]
            node = node_of_slot[slot]
            assert (w["node_id"], w["placement_group"]) == (node["node_id"], node["placement_group_id"]), (name, w)
            assert w["bundle"] == slot % SLOTS_PER_NODE
            # what a multi-node verl run on 2-GPU nodes gets: its local world is the node's GPUs
            assert w["env"]["RAY_LOCAL_WORLD_SIZE"] == str(SLOTS_PER_NODE)
            assert (w["env"]["WORLD_SIZE"], w["env"]["RANK"]) == (str(len(workers)), str(w["rank"]))
            assert w["gpu_ids"] == [str(w["bundle"])] == [w["env"]["CUDA_VISIBLE_DEVICES"]], w
    # each TP-2 rollout replica (workers 2r, 2r + 1) is on one node
    for workers in seen.values():
        for r in range(0, len(workers), 2):
            assert workers[r]["node_id"] == workers[r + 1]["node_id"]
    # node 1 died: b (on it) left naming the node; a (on node 0) is still in the group
    assert status["left"] == {"b": "node 1 lost", "c": "failed: ActorDiedError"}, status
    assert list(status["pipelines"]) == ["a"] and status["lost_nodes"] == [1]
    assert "pool node 1" in status["errors"]["b"] and status["noticed_after_s"] < 30
    # c had left, failed, before the loss was noticed: the node is still named as its cause (not when finished)
    assert set(found["c_home"]) & {2, 3} and "pool node 1" in status["errors"]["c"], found["c_home"]


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    print(json.dumps(_probe_multi_node()))
