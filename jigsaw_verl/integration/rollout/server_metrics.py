"""A vLLM or SGLang replica's queue and KV-cache figures, read from its Prometheus metrics.

verl's vLLM server (``verl/workers/rollout/vllm_rollout/vllm_async_server.py``) runs vLLM's OpenAI app on the
address verl registers the replica under (``LLMServerManager.server_addresses``), and that app serves vLLM's
metrics on ``/metrics``; verl's SGLang server (``verl/workers/rollout/sglang_rollout/async_sglang_server.py``)
launches SGLang's HTTP server there with ``enable_metrics`` on. Neither server has a ``telemetry()`` method, so this
is where the group's scheduler learns how many requests wait for admission on a replica
(``vllm:num_requests_waiting``, ``sglang:num_queue_reqs``), run there (``vllm:num_requests_running``,
``sglang:num_running_reqs``) and how full its KV cache is (``vllm:kv_cache_usage_perc``, before vLLM V1
``vllm:gpu_cache_usage_perc``; ``sglang:token_usage``). vLLM updates its gauges only with its stat logging on: verl
turns it off by default (``actor_rollout_ref.rollout.disable_log_stats``), so the entry point turns it on for a vLLM
pipeline in a group.

Only the standard library: it runs in the trainer's process on every poll of a rollout's tail monitor.
"""

from __future__ import annotations

import asyncio
import re
import urllib.request

# a backend's gauge -> the telemetry key the tail monitor reads
SERVER_GAUGES = {
    "vllm:num_requests_waiting": "waiting_requests",
    "vllm:num_requests_running": "running_requests",
    "vllm:kv_cache_usage_perc": "kv_cache_usage",
    "vllm:gpu_cache_usage_perc": "kv_cache_usage",
    "sglang:num_queue_reqs": "waiting_requests",
    "sglang:num_running_reqs": "running_requests",
    "sglang:token_usage": "kv_cache_usage",
}
# one sample line of Prometheus' text format: name, optional {labels}, value
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})?\s+(?P<value>\S+)")
METRICS_TIMEOUT_S = 1.0


def parse_server_metrics(text: str) -> dict[str, float]:
    """The gauges of :data:`SERVER_GAUGES` in a ``/metrics`` page, each summed over its label sets (a replica's
    engines); the KV-cache usage is the mean over them (a fraction, 0-1). Absent gauges are absent."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if line.startswith("#") or match is None or match["name"] not in SERVER_GAUGES:
            continue
        key = SERVER_GAUGES[match["name"]]
        sums[key] = sums.get(key, 0.0) + float(match["value"])
        counts[key] = counts.get(key, 0) + 1
    if "kv_cache_usage" in sums:
        sums["kv_cache_usage"] /= counts["kv_cache_usage"]
    return sums


async def read_server_metrics(address: str, timeout_s: float = METRICS_TIMEOUT_S) -> dict[str, float]:
    """:func:`parse_server_metrics` of ``http://{address}/metrics``; ``{}`` when it cannot be read in time (the
    monitor then sees no queue, as before)."""

    def fetch() -> str:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=timeout_s) as answer:
            return answer.read().decode("utf-8", "replace")

    try:
        return parse_server_metrics(await asyncio.to_thread(fetch))
    except (OSError, ValueError):
        return {}
