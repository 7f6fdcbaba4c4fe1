"""A Ray cluster of several nodes on this one machine, for the multi-node tests (Ray's own test cluster,
``ray.cluster_utils.Cluster``: a head node and worker nodes, each a raylet of its own with its own resources).

Each node is a real Ray node: a placement group's bundles are placed on one of them, an actor on a node dies with
its raylet, and the GCS marks a node whose raylet stopped answering dead. The head checks health every 0.5 s and
gives up after 6 misses (:data:`HEALTH_CHECKS`), so a killed node is noticed within a test.
A test must run this in a process of its own (the pytest process already holds a Ray session) and pass
``RAY_ADDRESS`` explicitly to whatever it starts (the machine may have other Ray clusters).
"""

from __future__ import annotations

import contextlib
import os

MiB = 2**20
# how the head notices a dead node: probe every 0.5 s, dead after 6 missed probes (about 3 s; Ray's default is tens
# of seconds, by when the group under test has finished; a raylet is a native process that answers within 3 s on
# a loaded machine)
HEALTH_CHECKS = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 500,
    "health_check_timeout_ms": 500,
    "health_check_failure_threshold": 6,
}


@contextlib.contextmanager
def ray_cluster(head_cpus: int, workers: list[dict], object_store_mib: int = 256):
    """Start a head of ``head_cpus`` CPUs and one worker node per entry of ``workers`` (``Cluster.add_node``
    arguments: ``num_cpus``, ``num_gpus``, ...); yield ``(cluster, worker_nodes)`` with ``RAY_ADDRESS`` set to it in
    this process's environment; shut everything down after."""
    from ray.cluster_utils import Cluster

    store = object_store_mib * MiB
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": head_cpus,
            "object_store_memory": store,
            "include_dashboard": False,
            "_system_config": dict(HEALTH_CHECKS),  # a fresh dict: Ray adds keys to it
        },
    )
    previous = os.environ.get("RAY_ADDRESS")
    try:
        nodes = [cluster.add_node(object_store_memory=store, **w) for w in workers]
        cluster.wait_for_nodes()
        os.environ["RAY_ADDRESS"] = cluster.address
        yield cluster, nodes
    finally:
        import ray

        ray.shutdown()  # this process's driver, if it connected (Ray refuses to remove the head under it)
        if previous is None:
            os.environ.pop("RAY_ADDRESS", None)
        else:
            os.environ["RAY_ADDRESS"] = previous
        cluster.shutdown()
