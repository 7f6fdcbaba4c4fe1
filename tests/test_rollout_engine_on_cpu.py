"""The continuous-batching replica: exact token counts, admission, interrupts."""

from __future__ import annotations

import numpy as np

from jigsaw_verl.model.catalogue import GPUS, MODELS
from jigsaw_verl.model.cost_model import CostModel
from jigsaw_verl.model.rollout_engine import ReplicaEngine, Request, decode_phase

M = MODELS["qwen3-4b"]


def _drain(eng: ReplicaEngine, start: float = 0.0):
    done, acts, t = [], [], start
    while (t := eng.next_event_s()) is not None:
        d, a = eng.advance(t)
        done += d
        acts += a
    return done, acts


def _requests(n: int, seed: int = 0, step: int = 0):
    rng = np.random.default_rng(seed)
    return [Request(step, i, int(rng.integers(10, 200)), int(rng.integers(1, 700))) for i in range(n)]


def test_every_token_once_and_phases_follow_batch():
    eng = ReplicaEngine(CostModel(GPUS["H100-80G"]), M, 1, kv_capacity_tokens=10**7)
    reqs = _requests(50)
    eng.submit(reqs, 0.0)
    done, acts = _drain(eng)
    assert sorted(r.index for r, _, _ in done) == list(range(50))
    assert all(g == r.response_len for r, _, g in done)
    assert eng.generated_tokens == sum(r.response_len for r in reqs)
    # finish times are ordered by length: continuous batching, nobody waits for anybody
    by_len = sorted(done, key=lambda x: x[0].response_len)
    assert all(a[1] <= b[1] + 1e-12 for a, b in zip(by_len, by_len[1:]))
    decode = [a for a in acts if a.kind.startswith("decode")]
    assert all(a.kind == decode_phase(a.batch) for a in decode)
    assert [a.batch for a in decode] == sorted((a.batch for a in decode), reverse=True)


def test_kv_capacity_limits_admission():
    cap = 3000
    eng = ReplicaEngine(CostModel(GPUS["H100-80G"]), M, 1, kv_capacity_tokens=cap)
    reqs = [Request(0, i, 100, 900) for i in range(10)]  # 1000 tokens each: three fit at a time
    eng.submit(reqs, 0.0)
    done, acts = _drain(eng)
    assert len(done) == 10
    assert max(a.batch for a in acts if a.kind.startswith("decode")) == 3


def test_submit_mid_decode_joins_after_the_step_in_flight():
    cost = CostModel(GPUS["H100-80G"])
    eng = ReplicaEngine(cost, M, 1, kv_capacity_tokens=10**7)
    eng.submit([Request(0, 0, 50, 2000)], 0.0)
    eng.advance(eng.next_event_s())  # prefill done, decoding
    t = 1.0
    eng.submit([Request(1, 0, 50, 10)], t)
    assert eng.next_event_s() >= t and eng.next_event_s() - t < cost.decode_step(M, 1, 1, 3000)
    done, _ = _drain(eng)
    assert [(r.step, g) for r, _, g in done] == [(1, 10), (0, 2000)]


def test_interrupt_reprefills_and_keeps_tokens():
    eng = ReplicaEngine(CostModel(GPUS["H100-80G"]), M, 1, kv_capacity_tokens=10**7)
    reqs = [Request(0, i, 100, 500 + i) for i in range(4)]
    eng.submit(reqs, 0.0)
    eng.advance(eng.next_event_s())
    eng.load_weights(0.5, 0.25, interrupt=True)
    done, acts = _drain(eng)
    kinds = [a.kind for a in acts]
    assert "weight_load" in kinds and "reprefill" in kinds
    assert kinds.index("reprefill") == kinds.index("weight_load") + 1
    assert all(g == r.response_len for r, _, g in done)
    assert eng.reprefill_tokens > 4 * 100
