"""verl's replica objects around rollout servers a test already runs.

verl's ``LLMServerManager`` builds one ``RolloutReplica`` per replica and its ``launch_servers`` starts the server
actors and records them (``servers``, ``server_handle``, ``server_address``); the migrator drives the replica
objects. The migration tests start their servers once per module and reuse them, so here a replica object of the
given class is built the way verl builds it and the running server is recorded in it as ``launch_servers`` would.
"""

from __future__ import annotations


def attach_replica(replica_cls, replica_rank: int, server, address: str, rollout_name: str = "cpu"):
    """A ``replica_cls`` (a verl ``RolloutReplica`` subclass) of one single-device node serving through ``server``
    (a Ray actor handle) at ``address``."""
    from verl.workers.config import RolloutConfig

    config = RolloutConfig(name=rollout_name, tensor_model_parallel_size=1)
    replica = replica_cls(replica_rank, config, None, gpus_per_node=1)
    replica.servers = [server]
    replica._server_handle = server
    replica._server_address = address
    return replica
