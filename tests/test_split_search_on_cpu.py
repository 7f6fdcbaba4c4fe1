"""The pruned split search: the exhaustive search's answer on unimodal costs and on the bundled workloads, in
far fewer simulations."""

from __future__ import annotations

import math

import numpy as np
import pytest

from jigsaw_verl.model.workload_file import bundled_workloads, load_workload
from jigsaw_verl.sim import split_search
from jigsaw_verl.sim.runner import Runner
from jigsaw_verl.sim.split_search import COARSE_POINTS, pruned_argmin


def unimodal(n: int, rng: np.random.Generator) -> np.ndarray:
    """A strictly decreasing then strictly increasing sequence of ``n`` costs, its minimum anywhere."""
    low = int(rng.integers(0, n))
    down = np.cumsum(rng.uniform(0.01, 5.0, size=low))[::-1]
    up = np.cumsum(rng.uniform(0.01, 5.0, size=n - low - 1))
    return np.concatenate([down, [0.0], up]) + 100.0


@pytest.mark.parametrize("n", [1, 2, 7, 8, 9, 15, 31, 63, 64, 127])
def test_the_pruned_search_finds_a_unimodal_costs_minimum_costing_each_index_once(n):
    rng = np.random.default_rng(n)
    for _ in range(200):
        costs = unimodal(n, rng)
        calls: list[int] = []

        def cost(i, costs=costs, calls=calls):
            calls.append(i)
            return float(costs[i])

        assert pruned_argmin(n, cost) == int(np.argmin(costs))
        assert len(calls) == len(set(calls)), "an index was simulated twice"
        if n > 8:
            assert len(calls) <= COARSE_POINTS + 2 * math.ceil(math.log2(n)) + 2, (n, len(calls))


def test_ties_go_to_the_lower_index_as_in_the_exhaustive_search():
    assert pruned_argmin(5, lambda i: 1.0) == 0
    assert pruned_argmin(40, lambda i: abs(i - 20) // 2) == 19


def test_on_the_bundled_16_gpu_workload_the_pruned_search_matches_the_exhaustive_one_with_fewer_runs(monkeypatch):
    (path,) = [p for p in bundled_workloads() if p.name.startswith("hetero")]
    w = load_workload(path)
    runs = {"n": 0}
    real = split_search.alone_makespan_s

    def counted(*args):
        runs["n"] += 1
        return real(*args)

    monkeypatch.setattr(split_search, "alone_makespan_s", counted)
    exhaustive = Runner(w, exhaustive=True).run_policy("areal")
    exhaustive_runs, runs["n"] = runs["n"], 0
    pruned = Runner(w).run_policy("areal")
    # 15 options on the whole pool per pipeline: the pruned search simulates fewer of them
    assert runs["n"] < exhaustive_runs
    assert pruned.makespan_s <= 1.02 * exhaustive.makespan_s


def test_an_engine_event_due_within_the_clocks_tolerance_is_not_re_armed_for_ever():
    """A split the search tries on 64 GPUs (AReaL mode, one long-CoT job on 32 rollout + 32 training GPUs): a
    replica's weight load ended 1e-9 s after the moment the simulator popped it as due; advancing the engine only
    to that moment left it pending and re-armed at the same moment, for ever (the search never returned)."""
    import signal
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    from split_search_check import scaled

    from jigsaw_verl.policy.baselines.areal import _areal_mode
    from jigsaw_verl.policy.baselines.placement import role_splits
    from jigsaw_verl.sim.split_search import alone_makespan_s

    (path,) = [p for p in bundled_workloads() if p.name.startswith("longcot-qwen3")]
    big = scaled(load_workload(path), 64, 8)
    spec = big.pipeline("b-3")
    split = role_splits(spec, big, tuple(range(64)))[31]
    assert (len(split.rollout), len(split.train)) == (32, 32)

    def hung(*_):
        raise TimeoutError("the simulation did not finish in 60 s")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)
    try:
        makespan = alone_makespan_s(spec, big, split, _areal_mode(spec), "areal")
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert 0 < makespan < 2000
