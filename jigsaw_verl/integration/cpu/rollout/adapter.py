"""The worker-side rollout (verl ``BaseRollout``) for the CPU server, used in verl's hybrid engine.

verl builds one per hybrid worker (``get_rollout_class(name, "async")``) and calls ``resume`` / ``release`` /
``update_weights`` on it around every training step. Weights travel as CPU tensors through Ray's object store
to the replica's server, which loads them; rank 0 of each replica's tensor-parallel group sends.

With ``JIGSAW_VERL_WEIGHT_AUDIT=<file>`` each sync appends one JSON line: the replica, the step, the checksum of
the actor's weights as sent and the checksum of the replica's weights after loading (they must be equal).
"""

from __future__ import annotations

import json
import os
from typing import Any

import ray
import torch
from verl.workers.rollout.base import BaseRollout

from jigsaw_verl.integration.cpu.rollout.replica import server_name
from jigsaw_verl.integration.cpu.rollout.server import state_checksum

AUDIT_ENV = "JIGSAW_VERL_WEIGHT_AUDIT"


class CPUServerAdapter(BaseRollout):
    """Hybrid-worker side of a CPU rollout replica."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, replica_rank: int = -1):
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ.get("RANK", "0"))
        tp = self.config.tensor_model_parallel_size * self.config.data_parallel_size
        self.replica_rank = rank // tp if replica_rank == -1 else replica_rank
        self.has_server = rank % tp == 0
        self._server = None

    def _handle(self):
        if self._server is None:
            self._server = ray.get_actor(server_name(self.replica_rank))
        return self._server

    async def resume(self, tags: list[str]) -> None:
        if self.config.free_cache_engine and self.has_server:
            await self._handle().wake_up.remote(tags=tags)

    async def release(self) -> None:
        if self.config.free_cache_engine and self.has_server:
            await self._handle().sleep.remote()

    @torch.no_grad()
    async def update_weights(
        self, weights, global_steps: int | None = None, wire_format: str = "named_tensors", **kwargs
    ):
        if wire_format != "named_tensors":
            raise ValueError(f"the CPU rollout takes full tensors (wire_format='named_tensors'), got {wire_format!r}")
        state: dict[str, torch.Tensor] = {}
        if hasattr(weights, "__aiter__"):
            async for name, tensor in weights:
                state[name] = _plain(tensor)
        else:
            for name, tensor in weights:
                state[name] = _plain(tensor)
        if not self.has_server:
            return
        server = self._handle()
        await server.update_weights.remote(state, global_steps)
        audit = os.environ.get(AUDIT_ENV)
        if audit:
            names = await server.param_names.remote()
            record = {
                "replica": self.replica_rank,
                "global_steps": global_steps,
                "actor": state_checksum({n: state[n] for n in names}),
                "rollout": await server.weights_checksum.remote(),
            }
            with open(audit, "a") as f:
                f.write(json.dumps(record) + "\n")


def _plain(tensor: torch.Tensor) -> torch.Tensor:
    if hasattr(tensor, "full_tensor"):  # a DTensor shard: gather (collective on every rank)
        tensor = tensor.full_tensor()
    return tensor.detach().to("cpu", dtype=torch.float32, copy=True)
