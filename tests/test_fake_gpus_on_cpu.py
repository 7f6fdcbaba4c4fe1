"""Two pipelines' workers in the group's shared pool, the second placed after the first's workers exist (the start-up
leases run them one after the other). On a Ray cluster that declares GPUs (``ray.init(num_gpus=2)``: Ray assigns
logical GPU ids and sets ``CUDA_VISIBLE_DEVICES`` without a GPU) rank r of each pipeline lands in bundle r and sees
the same accelerator, so its rollout engine and its training state share that GPU, as the leases and the memory
rule assume; on the CPU platform (``VERL_PLATFORM=cpu``, a slot is a CPU) the second pipeline's worker group is
placed too (verl's one-CPU start-up task fits beside the first's workers).

The workers are verl's own: ``RayWorkerGroup`` over :class:`~jigsaw_verl.integration.shared_pool.SharedPoolManager`'s
pool, each a verl ``Worker`` (which reads ``CUDA_VISIBLE_DEVICES`` as it starts). verl's vLLM replica launches its
server on the accelerator id its workers report (``ray.get_runtime_context().get_accelerator_ids()``). The cluster
runs in a child process: the other tests' shared Ray session declares no GPUs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

POOL_SLOTS = 2


def _probe_cluster(device: str) -> dict:
    """In a fresh Ray cluster (``device`` ``cuda``: with 2 GPUs; ``cpu``: the CPU platform): place two pipelines'
    worker groups in one shared pool, one after the other; per pipeline and rank, what the worker sees."""
    import ray
    from ray.util.placement_group import placement_group
    from verl.single_controller.base import Worker
    from verl.single_controller.base.decorator import Dispatch, register
    from verl.single_controller.ray.base import RayClassWithInitArgs, RayWorkerGroup

    from jigsaw_verl.integration.shared_pool import SharedPoolManager
    from jigsaw_verl.runtime.pool_placement import VERL_COLOCATE, PoolPlacement, pool_bundle

    class Probe(Worker):
        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        def where(self):
            context = ray.get_runtime_context()
            return {
                "rank": self.rank,
                "gpu_ids": [str(i) for i in context.get_accelerator_ids().get("GPU", [])],
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
                "placement_group": context.get_placement_group_id(),
            }

    gpus = POOL_SLOTS if device == "cuda" else 0
    ray.init(num_cpus=16, num_gpus=gpus, include_dashboard=False, log_to_driver=False)
    try:
        colocate = VERL_COLOCATE * 2
        bundle = pool_bundle("GPU" if device == "cuda" else "CPU", colocate)
        pg = placement_group([bundle] * POOL_SLOTS, strategy="STRICT_PACK")
        ray.get(pg.ready(), timeout=60)
        placement = PoolPlacement((pg,), POOL_SLOTS, colocate, POOL_SLOTS)
        seen = {}
        for pipeline in ("a", "b"):
            manager = SharedPoolManager({"global_pool": [POOL_SLOTS]}, {}, placement, pipeline)
            manager.create_resource_pool()
            group = RayWorkerGroup(
                resource_pool=manager.resource_pool_dict["global_pool"],
                ray_cls_with_init=RayClassWithInitArgs(cls=ray.remote(Probe)),
                device_name=device,
            )
            seen[pipeline] = group.where()
        return {"placement_group": pg.id.hex(), "seen": seen}
    finally:
        ray.shutdown()


def _probe(device: str) -> dict:
    # verl's own GPU platform, or the CPU backend's (selected by VERL_PLATFORM)
    env = {k: v for k, v in os.environ.items() if k != "VERL_PLATFORM"}
    env.update({"VERL_PLATFORM": "cpu"} if device == "cpu" else {})
    r = subprocess.run([sys.executable, __file__, device], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_second_pipelines_workers_are_placed_beside_the_firsts_on_the_cpu_platform():
    found = _probe("cpu")
    a, b = found["seen"]["a"], found["seen"]["b"]
    assert [w["rank"] for w in a] == [w["rank"] for w in b] == [0, 1]
    assert {w["placement_group"] for w in a + b} == {found["placement_group"]}


def test_rank_r_of_two_pipelines_gets_the_same_gpu_in_the_shared_pool():
    found = _probe("cuda")
    a, b = found["seen"]["a"], found["seen"]["b"]
    assert [w["rank"] for w in a] == [w["rank"] for w in b] == [0, 1]
    for wa, wb in zip(a, b, strict=True):
        assert wa["placement_group"] == wb["placement_group"] == found["placement_group"]
        assert len(wa["gpu_ids"]) == 1 and wa["gpu_ids"] == wb["gpu_ids"], (wa, wb)
        assert wa["cuda_visible_devices"] == wb["cuda_visible_devices"] == wa["gpu_ids"][0], (wa, wb)
    assert a[0]["gpu_ids"] != a[1]["gpu_ids"]  # the ranks of one pipeline are on different GPUs


if __name__ == "__main__":
    print(json.dumps(_probe_cluster(sys.argv[1])))
