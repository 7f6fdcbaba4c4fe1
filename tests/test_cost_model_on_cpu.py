"""Cost model: closed forms agree with step-by-step sums; rooflines and co-location behave as documented."""

from __future__ import annotations

import itertools

import pytest

from jigsaw_verl.model.catalogue import GPUS, MODELS
from jigsaw_verl.model.cost_model import CostModel, Work

H100 = GPUS["H100-80G"]


@pytest.mark.parametrize("model,tp", [("qwen3-4b", 1), ("qwen3-32b", 4), ("qwen2.5-7b", 2)])
def test_decode_segment_equals_step_sum(model, tp):
    cost, m = CostModel(H100), MODELS[model]
    c = cost.decode_coeffs(m, tp)
    for batch, ctx0, steps in itertools.product((1, 7, 64, 900), (10, 5_000, 300_000), (1, 2, 37, 1500)):
        direct = sum(cost.decode_step(m, tp, batch, ctx0 + i * batch) for i in range(steps))
        assert cost.decode_segment(c, batch, ctx0, steps) == pytest.approx(direct, rel=1e-9)


def test_decode_steps_until_is_the_step_in_flight():
    cost, m = CostModel(H100), MODELS["qwen3-4b"]
    c = cost.decode_coeffs(m, 1)
    for dt in (1e-6, 0.004, 0.5, 3.0):
        k = cost.decode_steps_until(c, 32, 40_000, dt, 10_000)
        assert cost.decode_segment(c, 32, 40_000, k) >= dt or k == 10_000
        assert k == 1 or cost.decode_segment(c, 32, 40_000, k - 1) < dt


def test_roofline_regimes():
    cost, m = CostModel(H100), MODELS["qwen3-4b"]
    c = cost.decode_coeffs(m, 1)
    small = cost.decode_work(c, 1, 1, 1, 500)
    big = cost.decode_work(c, 1, 1, 4096, 4096 * 200)
    assert small.memory_s > small.compute_s  # batch 1 decode reads weights: memory-bound
    assert big.compute_s > big.memory_s  # a huge batch of short contexts: compute-bound
    # A memory-bound step costs about the same at any small batch: 8 sequences, not 8x the time.
    assert cost.decode_step(m, 1, 8, 8 * 300) / cost.decode_step(m, 1, 1, 300) < 1.1
    # Training costs 3x the forward FLOPs times the recompute factor.
    t, lp = cost.train_work(m, 1e6, 1e9), cost.logprob_work(m, 1e6, 1e9)
    ratio = (t.compute_s * cost.eff.train_mfu) / (lp.compute_s * cost.eff.logprob_mfu)
    assert ratio == pytest.approx(3 * cost.eff.train_recompute_factor)


def test_durations_cover_their_resource_seconds():
    """An exclusive sub-stage on g GPUs never uses more than d*g GPU-seconds of either resource (the lower
    bound relies on it)."""
    cost, m = CostModel(GPUS["A100-80G"]), MODELS["llama-3.1-8b"]
    for gpus, tokens in itertools.product((1, 2, 8, 16), (100.0, 1e5)):
        sq = tokens * 300
        assert cost.logprob_micro_batch(m, gpus, tokens, sq) * gpus >= cost.logprob_work(m, tokens, sq).compute_s
        assert cost.train_micro_batch(m, gpus, tokens, sq) * gpus >= cost.train_work(m, tokens, sq).compute_s
    for tp, batch, steps in itertools.product((1, 2), (1, 50), (1, 300)):
        c = cost.decode_coeffs(m, tp)
        ctx0 = batch * 400.0
        d = cost.decode_segment(c, batch, ctx0, steps)
        w = cost.decode_work(c, tp, steps, batch * steps, steps * ctx0 + batch * steps * (steps - 1) / 2)
        assert d * tp >= w.compute_s - 1e-12 and d * tp >= w.memory_s - 1e-12
        assert cost.prefill(m, tp, 4000, 4000 * 500) * tp >= cost.prefill_work(m, 4000, 4000 * 500).compute_s


def test_colocation_rates():
    cost = CostModel(H100)
    decode = cost.stage_load(Work(0.3, 0.9), 1.0, 1, sm_share=0.35, mem_share=0.3)
    train = cost.stage_load(Work(0.95, 0.1), 1.0, 1, sm_share=0.65, mem_share=0.6)
    ra, rb = cost.colocated_rates(decode, train)
    keep = 1 - cost.eff.colocation_penalty
    assert decode.memory_bound and not train.memory_bound
    assert ra > 0.8 * keep  # the memory-bound stage keeps most of its speed on a third of the SMs
    assert rb == pytest.approx(keep * 0.65 / 0.95)  # the compute-bound one gets its SM share
    assert ra * decode.sm_need + rb * train.sm_need <= 1 + 1e-9
    assert ra * decode.bw_need + rb * train.bw_need <= 1 + 1e-9
    over = cost.stage_load(Work(0.3, 0.9), 1.0, 1, sm_share=0.5, mem_share=0.5)
    assert cost.colocated_rates(over, train) is None  # SM shares over 100 %: the mechanism says "can't"
    two_mem = cost.stage_load(Work(0.3, 0.9), 1.0, 1, sm_share=0.5, mem_share=0.4)
    r1, r2 = cost.colocated_rates(two_mem, two_mem)
    assert r1 * 0.9 + r2 * 0.9 <= 1 + 1e-9  # two memory-bound stages split the bandwidth


def _paper_like(**over):
    """One Qwen3-4B GRPO job on 4 x H100 at rollout TP 4 (the calibrated setting's shape, 2 steps)."""
    from jigsaw_verl.model.spec import workload_from_dict

    p = {
        "name": "a",
        "model": "qwen3-4b",
        "batch_prompts": 16,
        "group_size": 4,
        "rollout_tp": 4,
        "prompt_len": {"median": 110, "p99": 300, "max": 512},
        "response_len": {"median": 1500, "p99": 8192, "max": 8192, "group_corr": 0.5},
        "steps": 2,
    }
    p.update(over)
    return workload_from_dict({"name": "p", "cluster": {"gpu": "H100-80G", "num_gpus": 4}, "pipelines": [p]})


def test_offload_adds_its_pcie_round_trips_to_each_stage_and_the_reference_streams_its_weights():
    import numpy as np

    from jigsaw_verl.model.graph import logprob_nodes, update_nodes, weight_sync_node
    from jigsaw_verl.model.memory import WEIGHT_BYTES_PER_PARAM

    cost, seq = CostModel(H100), np.full(64, 2000, dtype=np.int64)
    plain, off = _paper_like().pipelines[0], _paper_like(param_offload=True, optimizer_offload=True).pipelines[0]
    m = plain.model

    def total(nodes):
        return sum(n.duration_s for n in nodes)

    param, opt = cost.param_offload_round_trip(m, 4), cost.optimizer_offload_round_trip(m, 4)
    # fp32 params (4 B) and Adam's two fp32 moments (8 B) per parameter, sharded over 4 GPUs, there and back
    assert param == pytest.approx(2 * 4 * m.params / 4 / (H100.pcie_bytes_per_s * cost.eff.interconnect_efficiency))
    assert opt == pytest.approx(2 * param)
    assert total(logprob_nodes(off, cost, 0, 4, seq)) == pytest.approx(
        total(logprob_nodes(plain, cost, 0, 4, seq)) + param
    )
    assert total(update_nodes(off, cost, 0, 4, seq)) == pytest.approx(
        total(update_nodes(plain, cost, 0, 4, seq)) + param + opt
    )
    sync = {s: weight_sync_node(s, cost, 0, 4, colocated=True, rollout_gpus=4, same_node=True) for s in (plain, off)}
    assert sync[off].duration_s == pytest.approx(sync[plain].duration_s + param)
    ref = [n for n in logprob_nodes(plain, cost, 0, 4, seq) if n.name.startswith("ref_logprob")]
    old = [n for n in logprob_nodes(plain, cost, 0, 4, seq) if n.name.startswith("old_logprob")]
    stream = WEIGHT_BYTES_PER_PARAM * m.params / 4 / (H100.pcie_bytes_per_s * cost.eff.interconnect_efficiency)
    assert all(r.duration_s == pytest.approx(o.duration_s + stream) for r, o in zip(ref, old, strict=True))


def test_log_prob_micro_batches_follow_their_own_token_budget():
    import numpy as np

    from jigsaw_verl.model.graph import logprob_nodes

    cost, seq = CostModel(H100), np.full(64, 2000, dtype=np.int64)
    wide = _paper_like(train_micro_batch_tokens=16384).pipelines[0]
    narrow = _paper_like(train_micro_batch_tokens=16384, logprob_micro_batch_tokens=8704).pipelines[0]
    count = {
        s: sum(n.name.startswith("old_logprob") for n in logprob_nodes(s, cost, 0, 4, seq)) for s in (wide, narrow)
    }
    assert (count[wide], count[narrow]) == (2, 4)  # 128k tokens in 4 x 16384-token or 4 x 8704-token micro-batches


def test_gpu_memory_utilization_caps_the_kv_cache_and_slows_a_crowded_rollout():
    from jigsaw_verl.model.graph import ROLLOUT
    from jigsaw_verl.model.memory import kv_capacity_tokens
    from jigsaw_verl.policy.registry import POLICIES
    from jigsaw_verl.sim.simulator import Simulator

    m = MODELS["qwen3-4b"]
    capped = kv_capacity_tokens(m, H100, tp=4, gpu_memory_utilization=0.05)
    assert capped == int((4 * 0.05 * H100.memory_bytes - 2 * m.params) // m.kv_bytes_per_token)
    assert capped < kv_capacity_tokens(m, H100, tp=4)
    rollout_s = {}
    for gmu in (None, 0.05):
        w = _paper_like(gpu_memory_utilization=gmu)
        (policy,) = POLICIES.get("verl-seq").build(w)
        r = Simulator(w, policy).run()
        rollout_s[gmu] = sum(s.end_s - s.start_s for s in r.stages if s.stage == ROLLOUT)
    # 64 sequences of up to 8.7k tokens do not all fit ~{capped} KV tokens: admission waits, the rollout is longer
    assert rollout_s[0.05] > 1.05 * rollout_s[None]
