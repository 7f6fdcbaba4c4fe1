"""A one-step smoke of ``scripts/bench_live.py``: the tail-heavy countdown recipes under the live baselines and
jigsaw, each a real ``jigsaw-verl mux`` run (verl's trainer, the CPU rollout servers, slots pinned to cores).

It checks what the benchmark's figures rest on: ``verl-split`` keeps each pipeline on its own slot, ``verl-seq``
runs one pipeline's steps after the other's (the policy holds the second while the first is between stages), a
multiplexed pipeline computes exactly what it computes alone on the pool, and the table has every column."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import bench_live  # noqa: E402

CONFIGS = ("verl-split", "verl-seq", "jigsaw")


def _step_leases(folder: Path) -> list[dict]:
    leases = json.loads((folder / "leases.json").read_text())
    return [s for s in leases if s["step"] >= 0 and s["stage"] in ("rollout", "logprob", "update", "weight_sync")]


def figures_of(result: dict, name: str) -> dict:
    return result["summary"][name]


def test_bench_live_smoke_runs_the_baselines_and_jigsaw_live_and_reports_them(tmp_path, capsys):
    out = tmp_path / "bench"
    rc = bench_live.main(
        ["--steps", "1", "--rounds", "1", "--configs", ",".join(CONFIGS), "--out", str(out),
         "--json", str(tmp_path / "bench.json")]
    )  # fmt: skip
    assert rc == 0
    printed = capsys.readouterr().out
    assert "| jigsaw |" in printed and "vs verl-split" in printed, printed
    result = json.loads((tmp_path / "bench.json").read_text())
    for name in CONFIGS:
        figures = result["summary"][name]
        assert figures["makespan_s"][0] > 0 and figures["tokens_per_s"][0] > 0, figures
        assert 0 < figures["busy_fraction"][0] <= 1.0 + 1e-9, figures
        assert len(result["rounds"][0][name]["pipelines"]) == 2
    # verl-split: each pipeline on one slot of its own, the whole run
    split = _step_leases(out / "round0" / "verl-split")
    slots = {p: {g for s in split if s["pipeline"] == p for g in s["gpus"]} for p in {s["pipeline"] for s in split}}
    assert sorted(map(sorted, slots.values())) == [[0], [1]], slots
    # verl-seq: one pipeline's steps, then the other's
    seq = _step_leases(out / "round0" / "verl-seq")
    spans = sorted(
        (min(s["start_s"] for s in seq if s["pipeline"] == p), max(s["end_s"] for s in seq if s["pipeline"] == p))
        for p in {s["pipeline"] for s in seq}
    )
    assert spans[0][1] <= spans[1][0], spans
    # multiplexing changes no response or reward: jigsaw's pipelines equal their verl-seq (alone) runs
    assert result["same_as_verl_seq"] == {"jigsaw": [True]}
    # the replay predicts every configuration; a baseline replayed from its own leases comes out as it ran
    assert sorted(result["predicted_summary"]) == sorted(CONFIGS), result["predicted_summary"]
    for name in ("verl-split", "verl-seq"):
        guess, real = result["predicted_summary"][name]["makespan_s"][0], figures_of(result, name)["makespan_s"][0]
        assert abs(guess / real - 1) < 0.15, (name, guess, real)
    assert "the replay's prediction" in printed and "lower bound" in printed, printed
    # the bounds hold for the baselines they come from (the multiplexed runs' own stage times vary from the baselines')
    for name in ("verl-split", "verl-seq"):
        floor = result["makespan_bound_s"][0][name]
        assert figures_of(result, name)["makespan_s"][0] >= floor * (1 - 1e-6), (name, floor)
