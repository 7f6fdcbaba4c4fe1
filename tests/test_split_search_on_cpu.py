"""The pruned split search: the exhaustive search's answer on unimodal costs and on the bundled workloads, in
far fewer simulations."""

from __future__ import annotations

import math

import numpy as np
import pytest

from jigsaw_verl.model.workload_file import bundled_workloads, load_workload
from jigsaw_verl.sim import split_search
from jigsaw_verl.sim.runner import Runner
from jigsaw_verl.sim.split_search import COARSE_POINTS, fastest_split_alone, fastest_split_pruned, pruned_argmin


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
    exhaustive = Runner(w, split_search=fastest_split_alone).run_policy("areal")
    exhaustive_runs, runs["n"] = runs["n"], 0
    pruned = Runner(w, split_search=fastest_split_pruned).run_policy("areal")
    # 15 options on the whole pool per pipeline: the pruned search simulates fewer of them
    assert runs["n"] < exhaustive_runs
    assert pruned.makespan_s <= 1.02 * exhaustive.makespan_s
