"""A vLLM or SGLang replica's queue and KV figures from its Prometheus metrics, as the migrator's telemetry reads
them for a server without ``telemetry()`` (verl's vLLM and SGLang servers). Neither runs here: a test double serves
``/metrics`` over real HTTP in the backend's text format and metric names, and a Ray actor double stands in for verl's
server actor (no ``telemetry`` method) behind verl's real ``RolloutReplica`` base; the load balancer and the migrator
are the real ones."""

from __future__ import annotations

import asyncio
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from jigsaw_verl.integration.rollout.server_metrics import parse_server_metrics, read_server_metrics

# what vLLM's /metrics page holds for a replica with two engines (data parallel), V1 names, comments included
VLLM_METRICS_PAGE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="qwen"} 5.0
vllm:num_requests_running{engine="1",model_name="qwen"} 4.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="qwen"} 3.0
vllm:num_requests_waiting{engine="1",model_name="qwen"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="qwen"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="qwen"} 0.25
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="qwen"} 1234.0
"""

# what SGLang's /metrics page holds (verl launches it with enable_metrics), comments included
SGLANG_METRICS_PAGE = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="qwen"} 7.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="qwen"} 2.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="qwen"} 0.625
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="qwen"} 99.0
"""


def test_parse_sums_queues_over_engines_and_averages_kv_use():
    assert parse_server_metrics(VLLM_METRICS_PAGE) == {
        "running_requests": 9.0,
        "waiting_requests": 3.0,
        "kv_cache_usage": pytest.approx(0.375),
    }
    old = 'vllm:gpu_cache_usage_perc{model_name="m"} 0.8\nvllm:num_requests_waiting{model_name="m"} 2\n'
    assert parse_server_metrics(old) == {"kv_cache_usage": 0.8, "waiting_requests": 2.0}  # vLLM before V1
    assert parse_server_metrics(SGLANG_METRICS_PAGE) == {
        "running_requests": 7.0,
        "waiting_requests": 2.0,
        "kv_cache_usage": 0.625,
    }
    assert parse_server_metrics("sglang:generation_tokens_total 4\n# no gauge of either\n") == {}


class _MetricsDouble(BaseHTTPRequestHandler):
    """Test double of a backend's HTTP app: serves its ``page`` at ``/metrics``, 404 elsewhere."""

    page = ""

    def do_GET(self):  # noqa: N802 (http.server's name)
        found = self.path == "/metrics"
        body = self.page.encode() if found else b"not found"
        self.send_response(200 if found else 404)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(params=["vllm", "sglang"])
def backend_address(request):
    """(backend name, address of a double of its HTTP app serving its metrics page)."""
    page = {"vllm": VLLM_METRICS_PAGE, "sglang": SGLANG_METRICS_PAGE}[request.param]
    server = ThreadingHTTPServer(("127.0.0.1", 0), type("Page", (_MetricsDouble,), {"page": page}))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield request.param, f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()


class ServerActorDouble:
    """Stands in for verl's ``vLLMHttpServer`` / ``SGLangHttpServer`` actor: it has no ``telemetry`` method (what the
    migrator keys on)."""

    def resume_generation(self):
        return None


def _replica_double_cls():
    from verl.workers.rollout.replica import RolloutReplica

    class ReplicaDouble(RolloutReplica):
        """verl's ``RolloutReplica`` as vLLM's and SGLang's replicas inherit it; its server is attached, not
        launched."""

        async def launch_servers(self):
            raise NotImplementedError("ReplicaDouble: attach its server")

    return ReplicaDouble


def test_the_migrator_reads_a_replicas_queue_from_its_metrics(ray_session, backend_address):
    from replica_attach import attach_replica

    from jigsaw_verl.integration.rollout.load_balancer import MigratingLoadBalancer
    from jigsaw_verl.integration.rollout.migrator import RolloutMigrator

    ray = ray_session
    backend, address = backend_address
    servers = {address: ray.remote(ServerActorDouble).options(num_cpus=0).remote()}
    replicas = {address: attach_replica(_replica_double_cls(), 0, servers[address], address, rollout_name=backend)}
    lb = ray.remote(MigratingLoadBalancer).options(num_cpus=0).remote(servers=servers)
    try:
        stats = asyncio.run(RolloutMigrator(lb, replicas).telemetry())[address]
        expected = {"vllm": (3.0, 9.0, 0.375), "sglang": (2.0, 7.0, 0.625)}[backend]
        assert (stats["waiting_requests"], stats["running_requests"]) == expected[:2]
        assert stats["kv_cache_usage"] == pytest.approx(expected[2])
        assert stats["routable"] and stats["live_requests"] == 0
        # an address nothing serves: no figures (the monitor sees no queue), within the read's timeout
        assert asyncio.run(read_server_metrics("127.0.0.1:9", timeout_s=0.5)) == {}
    finally:
        for handle in (*servers.values(), lb):
            ray.kill(handle)
