"""``CPURolloutReplica``: verl's ``RolloutReplica`` for the CPU server, registered as rollout name ``cpu``.

Built on ``verl/workers/rollout/replica.py``: verl creates replicas, hands them the hybrid worker group, and
talks to ``server_handle`` for generation and control; this class only launches the servers.
"""

from __future__ import annotations

from typing import Any

import ray
from verl.workers.rollout.replica import RolloutReplica

from jigsaw_verl.integration.cpu.rollout.server import CPURolloutServer
from jigsaw_verl.integration.cpu.slot_cores import pin_this_worker
from jigsaw_verl.integration.cpu.slot_memory import one_holder, slot_memory_of_this_worker

SERVER_PREFIX = "cpu_server"


def server_name(replica_rank: int, node_rank: int = 0) -> str:
    """Ray actor name of a replica's server (the worker-side adapter finds it by this name)."""
    return f"{SERVER_PREFIX}_{replica_rank}_{node_rank}"


class CPURolloutReplica(RolloutReplica):
    """A rollout replica served by :class:`CPURolloutServer` (one node, ``tensor_model_parallel_size`` CPU
    slots of the worker group; the server itself takes no Ray CPU so it fits beside the trainer). In a group's
    pool the server charges the device-memory ledger on its workers' slots, and the workers and the server run on
    those slots' cores only (:mod:`~jigsaw_verl.integration.cpu.slot_cores`)."""

    async def launch_servers(self) -> None:
        if self.nnodes != 1:
            raise ValueError("the CPU rollout runs one node per replica")
        node_id, memory, cores = None, None, None
        if self.workers:
            node_id = await self.workers[0].__ray_call__.remote(lambda w: ray.get_runtime_context().get_node_id())
            memory = one_holder([await w.__ray_call__.remote(_slot_memory) for w in self.workers])
            pinned = [await w.__ray_call__.remote(pin_this_worker) for w in self.workers]
            cores = None if None in pinned else tuple(sorted({c for p in pinned for c in p}))
        options = {"name": server_name(self.replica_rank), "max_concurrency": self.max_concurrency, "num_cpus": 0}
        if node_id is not None:
            options["scheduling_strategy"] = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(
                node_id=node_id, soft=False
            )
        server = (
            ray.remote(CPURolloutServer)
            .options(**options)
            .remote(
                config=self.config,
                model_config=self.model_config,
                replica_rank=self.replica_rank,
                memory=memory,
                cores=cores,
            )  # fmt: skip
        )
        await server.telemetry.remote()  # raises here if the model cannot load
        self.servers = [server]
        self._server_handle = server
        self._server_address = f"cpu-rollout-{self.replica_rank}"

    async def sleep(self) -> None:
        await self.servers[0].wait_for_requests_to_drain.remote()
        await super().sleep()

    async def abort_all_requests(self, reject_request: bool = False) -> dict[str, Any]:
        """Answers as verl's ``vLLMReplica.abort_all_requests`` does (``aborted_count``, ``request_ids``), plus the
        context the aborted requests will re-prefill."""
        return await self.servers[0].abort_all_requests.remote(reject_request=reject_request)

    async def abort_request(self, request_id: str) -> dict[str, Any]:
        """One request, as verl's ``vLLMReplica.abort_request`` (``aborted``, ``request_id``)."""
        return await self.servers[0].abort_request.remote(request_id)


def _slot_memory(worker):
    """Run in a worker (``__ray_call__``): its slot in the pool's ledger."""
    return slot_memory_of_this_worker()
