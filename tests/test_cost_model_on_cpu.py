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
