"""A vLLM replica's queue and KV figures from its Prometheus metrics, as the migrator's telemetry reads them for a
server without ``telemetry()`` (verl's vLLM server). No vLLM runs here: a test double serves ``/metrics`` over real
HTTP in vLLM's text format and metric names, and a Ray actor double stands in for verl's vLLM server actor (no
``telemetry`` method); the load balancer and the migrator are the real ones."""

from __future__ import annotations

import asyncio
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from jigsaw_verl.integration.rollout.server_metrics import parse_vllm_metrics, read_vllm_metrics

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


def test_parse_sums_queues_over_engines_and_averages_kv_use():
    assert parse_vllm_metrics(VLLM_METRICS_PAGE) == {
        "running_requests": 9.0,
        "waiting_requests": 3.0,
        "kv_cache_usage": pytest.approx(0.375),
    }
    old = 'vllm:gpu_cache_usage_perc{model_name="m"} 0.8\nvllm:num_requests_waiting{model_name="m"} 2\n'
    assert parse_vllm_metrics(old) == {"kv_cache_usage": 0.8, "waiting_requests": 2.0}  # vLLM before V1
    assert parse_vllm_metrics("sglang:num_queue_reqs 4\n# nothing of vLLM's\n") == {}


class _MetricsDouble(BaseHTTPRequestHandler):
    """Test double of vLLM's OpenAI app: serves ``VLLM_METRICS_PAGE`` at ``/metrics``, 404 elsewhere."""

    def do_GET(self):  # noqa: N802 (http.server's name)
        found = self.path == "/metrics"
        body = VLLM_METRICS_PAGE.encode() if found else b"not found"
        self.send_response(200 if found else 404)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def vllm_address():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _MetricsDouble)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()


class VLLMServerActorDouble:
    """Stands in for verl's ``vLLMHttpServer`` actor: it has no ``telemetry`` method (what the migrator keys on)."""

    def resume_generation(self):
        return None


def test_the_migrator_reads_a_vllm_replicas_queue_from_its_metrics(ray_session, vllm_address):
    from jigsaw_verl.integration.rollout.load_balancer import MigratingLoadBalancer
    from jigsaw_verl.integration.rollout.migrator import RolloutMigrator

    ray = ray_session
    servers = {vllm_address: ray.remote(VLLMServerActorDouble).options(num_cpus=0).remote()}
    lb = ray.remote(MigratingLoadBalancer).options(num_cpus=0).remote(servers=servers)
    try:
        stats = asyncio.run(RolloutMigrator(lb, servers).telemetry())
        assert stats[vllm_address]["waiting_requests"] == 3.0 and stats[vllm_address]["running_requests"] == 9.0
        assert stats[vllm_address]["routable"] and stats[vllm_address]["live_requests"] == 0
        # an address nothing serves: no figures (the monitor sees no queue), within the read's timeout
        assert asyncio.run(read_vllm_metrics("127.0.0.1:9", timeout_s=0.5)) == {}
    finally:
        for handle in (*servers.values(), lb):
            ray.kill(handle)
