"""The CPU rollout server: a Ray actor serving verl's token-in/token-out rollout surface.

It mirrors what verl's vLLM server (``verl/workers/rollout/vllm_rollout/vllm_async_server.py``) offers the agent
loop, the load balancer and the trainer: ``generate`` returning a :class:`TokenOutput` (token ids, log-probs,
stop reason), ``abort_all_requests`` / ``abort_request`` (stop reason ``aborted``, tokens so far returned),
``resume_generation``, ``sleep`` / ``wake_up`` (weights are really released and re-allocated), weight updates
from the trainer after every step, and per-replica telemetry. Requests are decoded together by
:class:`~jigsaw_verl.integration.cpu.rollout.engine.CPUGenerationEngine` (continuous batching).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from typing import Any

import torch
from verl.workers.rollout.replica import TokenOutput

from jigsaw_verl.integration.cpu.rollout.engine import CPUGenerationEngine, Sequence, request_seed
from jigsaw_verl.integration.cpu.slot_cores import pin_process
from jigsaw_verl.integration.cpu.slot_memory import SlotMemory

logger = logging.getLogger(__name__)


class CPURolloutServer:
    """One rollout replica's server (run as a Ray actor).

    Args:
        config: verl's ``RolloutConfig`` (prompt/response length, max_num_seqs, seed, full_determinism).
        model_config: verl's ``HFModelConfig`` (local model path).
        replica_rank: this replica's rank.
        memory: where its device memory is charged (``None``: outside a pool with a ledger).
        cores: the cores of its replica's slots, which all its threads run on (``None``: outside a pool; one torch
            thread on any core).
    """

    def __init__(
        self,
        config: Any,
        model_config: Any,
        replica_rank: int,
        memory: SlotMemory | None = None,
        cores: tuple[int, ...] | None = None,
    ):
        from transformers import AutoModelForCausalLM

        self.config = config
        self.replica_rank = replica_rank
        path = _model_path(model_config)
        if cores is not None:
            pin_process(cores)
        else:
            torch.set_num_threads(1)
        self.model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32, attn_implementation="sdpa")
        self.model.eval()
        gen = self.model.generation_config
        eos = gen.eos_token_id if isinstance(gen.eos_token_id, list) else [gen.eos_token_id]
        self.engine = CPUGenerationEngine(
            self.model, eos_token_ids={e for e in eos if e is not None}, max_num_seqs=int(config.max_num_seqs or 256)
        )
        self.prompt_length = int(config.prompt_length)
        self.response_length = int(config.response_length)
        self.max_model_len = int(config.max_model_len or self.prompt_length + self.response_length)
        self.seed = int(getattr(config, "seed", 0) or 0)
        self.deterministic = bool(getattr(config, "full_determinism", False))
        self.global_steps: int | None = None
        self._shapes: dict[str, torch.Size] | None = None  # set while weights are released
        self._host_copy: dict[str, torch.Tensor] | None = None  # kept by a level-1 sleep
        self._waiting: list[tuple[Sequence, asyncio.Future]] = []
        self._live: list[tuple[Sequence, asyncio.Future]] = []
        self._step_lock = asyncio.Lock()
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._reject = False
        self._loop_task: asyncio.Task | None = None
        self._rng = torch.Generator().manual_seed(request_seed(self.seed, "replica", replica_rank))
        self._occurrences: dict[tuple, int] = {}
        self.stats_tokens = 0
        self.stats_requests = 0
        self._t0 = time.monotonic()
        self.memory = memory
        self.holder = f"engine/r{replica_rank}"
        self._resident = {"weights": True, "kv_cache": True}
        if memory is not None:
            weights = float(sum(p.numel() * p.element_size() for p in self.model.parameters()))
            reserved = float(config.gpu_memory_utilization) * memory.capacity()
            # vLLM sizes its KV pool to what the weights leave of gpu_memory_utilization x memory (at least none)
            self._bytes = {"weights": weights, "kv_cache": max(0.0, reserved - weights)}
            memory.charge(self.holder, weights + self._bytes["kv_cache"], startup=True)

    async def _hold(self, **resident: bool) -> None:
        """Charge the ledger what is resident after a change (``weights`` / ``kv_cache`` on or off)."""
        self._resident.update(resident)
        if self.memory is None:
            return
        held = sum(self._bytes[part] for part, on in self._resident.items() if on)
        if held > 0:
            await self.memory.charge_async(self.holder, held)
        else:
            await self.memory.release_async(self.holder)

    # ---- generation ------------------------------------------------------------------------------------------
    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: Any = None,
        video_data: Any = None,
        **kwargs: Any,
    ) -> TokenOutput:
        """Generate a response for ``prompt_ids``; returns when it completes or is aborted."""
        if image_data is not None or video_data is not None:
            raise ValueError("the CPU rollout serves text only (image_data/video_data given)")
        params = dict(sampling_params)
        room = self.max_model_len - len(prompt_ids)
        if room < 1:
            raise ValueError(
                f"prompt of {len(prompt_ids)} tokens leaves no room under max_model_len {self.max_model_len}"
            )
        max_tokens = params.pop("max_tokens", params.pop("max_new_tokens", None))
        if max_tokens is None:
            max_tokens = min(self.response_length, self.prompt_length + self.response_length - len(prompt_ids))
        max_tokens = max(1, min(int(max_tokens), room))
        if not self._resumed.is_set():
            if self._reject:
                return TokenOutput(token_ids=[], log_probs=None, stop_reason="aborted", extra_fields=self._extra())
            await self._resumed.wait()
        if self._shapes is not None:
            raise RuntimeError(f"CPU rollout replica {self.replica_rank} is asleep: its weights are released")
        temperature = float(params.get("temperature", 1.0))
        seq = Sequence(
            request_id=request_id,
            prompt_ids=list(prompt_ids),
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=float(params.get("top_p", 1.0)),
            top_k=int(params.get("top_k", -1) or -1),
            ignore_eos=bool(params.get("ignore_eos", False)),
        )
        if temperature > 0:
            seq.seed = self._sampling_seed(params.get("seed"), request_id, prompt_ids)
        future = asyncio.get_running_loop().create_future()
        self._waiting.append((seq, future))
        self.stats_requests += 1
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.create_task(self._run())
        return await future

    def _sampling_seed(self, seed: Any, request_id: str, prompt_ids: list[int]) -> int:
        """The caller's seed; under full determinism one derived from the request; otherwise a fresh one."""
        if seed is not None:
            return int(seed)
        if self.deterministic:
            # Under full determinism verl routes by request id, but its ids do not tell the n samples of a prompt
            # apart (often not even different prompts). Seed by step, id, prompt and the occurrence of that prompt:
            # the samples of a prompt differ, and arrival order between prompts is moot.
            key = (self.global_steps, request_id, hashlib.sha256(repr(list(prompt_ids)).encode()).hexdigest())
            self._occurrences[key] = self._occurrences.get(key, 0) + 1
            return request_seed(self.seed, *key, self._occurrences[key])
        return int(torch.randint(0, 2**62, (1,), generator=self._rng))

    def _extra(self) -> dict:
        return {"global_steps": self.global_steps}

    def _output(self, seq: Sequence) -> TokenOutput:
        return TokenOutput(
            token_ids=list(seq.token_ids),
            log_probs=list(seq.log_probs),
            stop_reason=seq.finished,
            num_preempted=0,
            # the seed it sampled with: a client resuming it passes this back, so the stream goes on (see engine)
            extra_fields={**self._extra(), "sampling_seed": seq.seed},
        )

    async def _run(self) -> None:
        while self._waiting or self._live:
            async with self._step_lock:
                room = self.engine.max_num_seqs - len(self._live)
                if room > 0 and self._waiting:
                    self._live += self._waiting[:room]
                    del self._waiting[:room]
                batch = [s for s, _ in self._live]
                await asyncio.to_thread(self.engine.step, batch)
                self.stats_tokens += len(batch)
                still = []
                for seq, fut in self._live:
                    if seq.finished and not fut.done():
                        fut.set_result(self._output(seq))
                    elif not seq.finished:
                        still.append((seq, fut))
                self._live = still
            await asyncio.sleep(0)

    # ---- control ---------------------------------------------------------------------------------------------
    async def abort_all_requests(self, reject_request: bool = False) -> dict[str, Any]:
        """Stop every request now (after the step in flight); each returns its tokens so far with stop reason
        ``aborted``. New requests wait for :meth:`resume_generation` (or fail at once with ``reject_request``)."""
        self._resumed.clear()
        self._reject = reject_request
        async with self._step_lock:
            ids = [seq.request_id for seq, fut in (*self._live, *self._waiting) if not fut.done()]
            aborted, context = self._abort(lambda s: True)
        # vLLM's answer (aborted_count, request_ids) plus the context the aborted requests will re-prefill
        return {"aborted_count": aborted, "request_ids": ids, "aborted_context_tokens": context}

    async def abort_request(self, request_id: str) -> dict[str, Any]:
        """Stop the request(s) with server-side id ``request_id`` (after the step in flight); each returns its
        tokens so far. ``aborted`` counts them (vLLM answers a bool for its single request)."""
        async with self._step_lock:
            aborted, context = self._abort(lambda s: s.request_id == request_id)
        return {"aborted": aborted, "request_id": request_id, "aborted_context_tokens": context}

    def _abort(self, match) -> tuple[int, int]:
        """Abort matching requests; return how many, and their context (prompt + tokens so far) in tokens,
        which is what resuming them elsewhere re-prefills."""
        n = context = 0
        for queue in (self._live, self._waiting):
            keep = []
            for seq, fut in queue:
                if match(seq) and not fut.done():
                    seq.finished = "aborted"
                    fut.set_result(self._output(seq))
                    n += 1
                    context += len(seq.prompt_ids) + len(seq.token_ids)
                else:
                    keep.append((seq, fut))
            queue[:] = keep
        return n, context

    async def resume_generation(self) -> None:
        self._reject = False
        self._resumed.set()

    async def wait_for_requests_to_drain(self) -> None:
        while self._waiting or self._live:
            await asyncio.sleep(0.01)

    # ---- memory ----------------------------------------------------------------------------------------------
    async def sleep(self, level: int = 2) -> None:
        """Release the weights, as vLLM's sleep levels do: level 1 keeps a host copy that ``wake_up`` restores
        (a migrated-from replica), level 2 drops them (the trainer sends fresh weights before the next
        rollout, verl's hybrid engine)."""
        await self.wait_for_requests_to_drain()
        async with self._step_lock:
            if self._shapes is None:
                params = dict(self.model.named_parameters())
                self._shapes = {n: p.shape for n, p in params.items()}
                self._host_copy = {n: p.data for n, p in params.items()} if level == 1 else None
                for p in params.values():
                    p.data = torch.empty(0)
            await self._hold(weights=False, kv_cache=False)

    async def wake_up(self, tags: list[str] | None = None) -> None:
        """Re-allocate released weights (``weights`` tag): from the host copy after a level-1 sleep, else zeros
        that the next weight update fills. The KV cache (``kv_cache`` tag) needs nothing on the CPU but its
        memory in the ledger."""
        # charged before it allocates, as the device fails at the allocation
        await self._hold(**{part: True for part in ("weights", "kv_cache") if tags is None or part in tags})
        if (tags is None or "weights" in tags) and self._shapes is not None:
            async with self._step_lock:
                copy = self._host_copy or {}
                for n, p in self.model.named_parameters():
                    p.data = copy[n] if n in copy else torch.zeros(self._shapes[n])
                self._shapes, self._host_copy = None, None

    async def clear_kv_cache(self) -> None:
        return None

    async def release_kv_cache(self) -> None:
        """Free the KV pool, weights stay (verl's non-naive weight sync)."""
        await self._hold(kv_cache=False)

    async def resume_kv_cache(self) -> None:
        await self._hold(kv_cache=True)

    async def start_profile(self, **kwargs: Any) -> None:
        return None

    async def stop_profile(self) -> None:
        return None

    # ---- weights ---------------------------------------------------------------------------------------------
    async def update_weights(self, state: dict[str, torch.Tensor], global_steps: int | None = None) -> None:
        """Load the trainer's weights (HF names); every parameter must be covered."""
        async with self._step_lock:
            if self._shapes is not None:
                raise RuntimeError(f"CPU rollout replica {self.replica_rank}: update_weights while asleep")
            result = self.model.load_state_dict(state, strict=False)
            tied = {"lm_head.weight"} if getattr(self.model.config, "tie_word_embeddings", False) else set()
            missing = set(result.missing_keys) - tied
            if missing or result.unexpected_keys:
                raise ValueError(
                    f"weight update does not match the rollout model: missing {sorted(missing)[:5]}, "
                    f"unexpected {sorted(result.unexpected_keys)[:5]}"
                )
        if global_steps is not None:
            self.global_steps = global_steps

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    async def param_names(self) -> list[str]:
        """Names of the model's parameters (tied weights once)."""
        return [n for n, _ in self.model.named_parameters()]

    async def weights_checksum(self) -> str:
        """SHA-256 over every parameter (name order), to compare with the trainer's."""
        return state_checksum(dict(self.model.named_parameters()))

    async def telemetry(self) -> dict[str, float]:
        """Live and waiting requests, tokens generated and tokens per second since start."""
        elapsed = max(time.monotonic() - self._t0, 1e-9)
        return {
            "live_requests": len(self._live),
            "waiting_requests": len(self._waiting),
            "tokens_generated": self.stats_tokens,
            "tokens_per_s": self.stats_tokens / elapsed,
            "requests": self.stats_requests,
        }


def _model_path(model_config: Any) -> str:
    """The local model folder from verl's ``HFModelConfig`` or its DictConfig form."""
    if hasattr(model_config, "get"):
        return model_config.get("local_path") or model_config.get("path")
    return getattr(model_config, "local_path", None) or model_config.path


def state_checksum(state: dict[str, torch.Tensor]) -> str:
    """SHA-256 of float32 parameter bytes in name order (tied duplicates counted once by name)."""
    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().to(torch.float32).contiguous().cpu()
        h.update(name.encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()
