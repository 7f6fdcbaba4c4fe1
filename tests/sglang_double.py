"""Test doubles of verl's SGLang rollout (``verl/workers/rollout/sglang_rollout/async_sglang_server.py``).

SGLang needs a GPU and is not installed here. These doubles stand in for verl's ``SGLangHttpServer`` (a Ray actor)
and ``SGLangReplica`` so the migrator can be run against SGLang's surface:

- :class:`SGLangHttpServerDouble` has exactly the public methods of verl's ``SGLangHttpServer``, with their
  parameters and defaults (``test_the_sglang_doubles_have_verls_signatures`` compares them with the installed verl's
  source), and behaves as verl's does where a migration touches it: ``abort_all_requests()`` takes no
  ``reject_request`` and pauses generation in SGLang's ``abort`` mode (running requests return with stop reason
  ``abort``; new ones wait for ``resume_generation()``); it has no ``abort_request``; ``wake_up()`` raises in hybrid
  mode (verl wakes SGLang in its weight update); ``sleep()`` releases weights and KV cache when
  ``free_cache_engine`` is on. Generation is a real CPU rollout server's, a Ray actor the double forwards to (its
  constructor takes that server instead of SGLang's launch arguments).
- :class:`SGLangReplicaDouble` is verl's real ``RolloutReplica`` with ``SGLangReplica``'s overrides: control goes to
  the first server only, and ``abort_all_requests`` ignores ``reject_request`` with verl's warning.
"""

from __future__ import annotations

import logging
from typing import Any

from verl.workers.rollout.replica import RolloutMode, RolloutReplica

logger = logging.getLogger(__name__)

# SGLang's finish-reason types for the CPU server's stop reasons
SGLANG_STOP_REASON = {"aborted": "abort", "completed": "stop", "length": "length"}


class SGLangHttpServerDouble:
    """Test double of verl's ``SGLangHttpServer`` (see the module docstring); run it as a Ray actor.

    Args:
        server: Ray handle of the CPU rollout server that generates.
        rollout_mode: verl's rollout mode (hybrid: ``wake_up`` raises, as verl's).
        free_cache_engine: whether ``sleep`` releases memory (verl's ``rollout.free_cache_engine``).
        address: the ``host:port`` it reports (no HTTP is served).
    """

    def __init__(self, server, rollout_mode: RolloutMode = RolloutMode.HYBRID, free_cache_engine: bool = True,
                 address: str = "127.0.0.1:0"):  # fmt: skip
        self._server = server
        self.rollout_mode = rollout_mode
        self.free_cache_engine = free_cache_engine
        self._address = address

    def get_master_address(self):
        host, port = self._address.rsplit(":", 1)
        return host, int(port)

    def get_server_address(self):
        host, port = self._address.rsplit(":", 1)
        return host, int(port)

    async def set_pd_peer(self, decode_peers: list, bootstrap_host: str):
        raise NotImplementedError("SGLangHttpServerDouble: prefill/decode disaggregation is not doubled")

    async def launch_server(self, master_address: str = None, master_port: int = None):
        return None  # the CPU server it forwards to is up already

    async def wake_up(self):
        if self.rollout_mode == RolloutMode.HYBRID:
            raise ValueError(f"wake_up not support rollout_mode {self.rollout_mode}")
        await self._server.wake_up.remote()

    @property
    def lora_as_adapter(self) -> bool:
        return False

    async def sleep(self):
        if self.free_cache_engine:
            await self._server.sleep.remote()

    async def clear_kv_cache(self):
        await self._server.clear_kv_cache.remote()

    async def release_kv_cache(self):
        if self.free_cache_engine:
            await self._server.release_kv_cache.remote()

    async def resume_kv_cache(self):
        if self.free_cache_engine:
            await self._server.resume_kv_cache.remote()

    async def generate(
        self,
        prompt_ids,
        sampling_params: dict[str, Any],
        request_id: str,
        image_data=None,
        video_data=None,
        bootstrap_host=None,
        bootstrap_port=None,
        bootstrap_room=None,
    ):
        params = dict(sampling_params)
        if "max_new_tokens" in params:  # SGLang's name for the budget; it takes vLLM's max_tokens too
            params["max_tokens"] = params.pop("max_new_tokens")
        output = await self._server.generate.remote(
            prompt_ids=list(prompt_ids), sampling_params=params, request_id=request_id,
            image_data=image_data, video_data=video_data,
        )  # fmt: skip
        output.stop_reason = SGLANG_STOP_REASON.get(output.stop_reason, output.stop_reason)
        return output

    async def set_global_steps(self, global_steps: int):
        await self._server.set_global_steps.remote(global_steps)

    async def abort_all_requests(self):
        # SGLang's pause_generation(mode="abort"): abort what runs, hold new requests until continue_generation
        await self._server.abort_all_requests.remote(reject_request=False)

    async def resume_generation(self):
        await self._server.resume_generation.remote()

    async def start_profile(self, **kwargs):
        return None

    async def stop_profile(self):
        return None


class SGLangReplicaDouble(RolloutReplica):
    """Test double of verl's ``SGLangReplica``: verl's ``RolloutReplica`` with its overrides (see the module
    docstring). A test attaches its servers (``replica_attach.attach_replica``) instead of launching them."""

    def __init__(
        self,
        replica_rank: int,
        config,
        model_config,
        gpus_per_node: int = 8,
        is_reward_model: bool = False,
        is_teacher_model: bool = False,
        name_suffix: str = "",
    ):
        super().__init__(
            replica_rank, config, model_config, gpus_per_node, is_reward_model, is_teacher_model, name_suffix
        )
        self.rollout_mode = RolloutMode.HYBRID

    async def launch_servers(self):
        raise NotImplementedError("SGLangReplicaDouble: attach() its servers; SGLang cannot launch here")

    async def abort_all_requests(self, reject_request: bool = False):
        if reject_request:
            logger.warning(
                "SGLang rollout ignores reject_request=True: requests arriving while generation "
                "is paused will wait for the next resume_generation() instead of failing over."
            )
        await self.servers[0].abort_all_requests.remote()

    async def resume_generation(self):
        await self.servers[0].resume_generation.remote()
