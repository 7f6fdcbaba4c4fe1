"""``jigsaw-verl simulate``: the table, the JSON schema, the trace and the plot."""

from __future__ import annotations

import json
import subprocess
import sys

import yaml
from conftest import tiny_workload_dict


def _simulate(tmp_path, *extra):
    f = tmp_path / "w.yaml"
    f.write_text(yaml.safe_dump(tiny_workload_dict()))
    out = {k: tmp_path / n for k, n in (("json", "r.json"), ("trace", "t.json"), ("plot", "u.png"))}
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "jigsaw_verl.cli",
            "simulate",
            str(f),
            "--json",
            str(out["json"]),
            "--trace",
            str(out["trace"]),
            "--plot",
            str(out["plot"]),
            *extra,
        ],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    return r, out


def test_simulate_writes_table_json_trace_plot(tmp_path):
    r, out = _simulate(tmp_path)
    for name in ("verl", "verl-seq", "verl-split", "streamrl", "areal", "rollmux"):
        assert f"\n{name} " in r.stdout
    assert "lower bound" in r.stdout
    data = json.loads(out["json"].read_text())
    assert data["workload"] == "tiny" and data["lower_bound_s"] > 0
    assert set(data["policies"]) == {"verl", "verl-seq", "verl-split", "streamrl", "areal", "rollmux"}
    verl = data["policies"]["verl"]
    assert verl["ratio_vs_verl"] == 1.0
    best_form = min(data["policies"]["verl-seq"]["makespan_s"], data["policies"]["verl-split"]["makespan_s"])
    assert verl["makespan_s"] == best_form
    for m in data["policies"].values():
        assert {"makespan_s", "tokens_per_s", "ratio_vs_verl", "gpu_busy_frac", "pipelines"} <= set(m)
        assert m["makespan_s"] >= m["lower_bound_s"] >= data["lower_bound_relaxed_s"] * (1 - 1e-12)
        assert 0 < m["gpu_busy_frac"] <= 1
        assert set(m["pipelines"]) == {"a", "b"}
        for p in m["pipelines"].values():
            assert p["mean_step_s"] > 0 and p["latency_inflation"] > 0
    # verl-seq runs a alone first on the whole pool, so a's step time is the alone reference
    assert abs(data["policies"]["verl-seq"]["pipelines"]["a"]["latency_inflation"] - 1.0) < 1e-9
    trace = json.loads(out["trace"].read_text())["traceEvents"]
    slices = [e for e in trace if e["ph"] == "X"]
    assert slices and all(e["name"].count("/") == 2 for e in slices)
    assert {e["tid"] for e in slices} == set(range(4))
    assert out["plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_policy_subset_still_reports_ratio_to_verl(tmp_path):
    r, out = _simulate(tmp_path, "--policies", "rollmux")
    data = json.loads(out["json"].read_text())
    assert list(data["policies"]) == ["rollmux"] and data["policies"]["rollmux"]["ratio_vs_verl"] > 0


def test_unwritable_output_fails_before_simulating(tmp_path):
    f = tmp_path / "w.yaml"
    f.write_text(yaml.safe_dump(tiny_workload_dict()))
    blocker = tmp_path / "file"
    blocker.write_text("")
    r = subprocess.run(
        [sys.executable, "-m", "jigsaw_verl.cli", "simulate", str(f), "--json", str(blocker / "x.json")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "--json" in r.stderr and "simulating" not in r.stderr


def test_a_baseline_that_cannot_run_the_pool_is_one_line_or_skipped(tmp_path):
    """On one GPU the disaggregated baselines have no split: named, it is one line and exit 2 before anything is
    simulated; in the default set it is skipped with a line saying so and the rest run."""
    one_gpu = tiny_workload_dict(num_gpus=1)
    f = tmp_path / "w.yaml"
    f.write_text(yaml.safe_dump(one_gpu))
    cmd = [sys.executable, "-m", "jigsaw_verl.cli", "simulate", str(f)]
    r = subprocess.run([*cmd, "--policies", "verl,streamrl"], capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("jigsaw-verl: error: --policies: streamrl cannot run") and "1 GPUs" in line
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "skipping streamrl: no configuration of it fits 1 GPUs" in r.stderr
    assert "\nverl-seq " in r.stdout and "\nstreamrl " not in r.stdout


def test_the_demo_simulates_the_scheduler_beside_every_baseline(tmp_path):
    """``jigsaw-verl demo``'s simulation (the multiplexed run aside): greedy and jigsaw in its table, JSON, trace
    and plot, beside every baseline."""
    from jigsaw_verl.policy.registry import BASELINES

    r = subprocess.run(
        [sys.executable, "-m", "jigsaw_verl.cli", "demo", "--skip-recipe", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    names = [*BASELINES, "greedy", "jigsaw"]
    assert list(json.loads((tmp_path / "demo.json").read_text())["policies"]) == names
    rows = {line.split()[0] for line in r.stdout.splitlines() if line.strip()}
    assert set(names) <= rows
    trace = json.loads((tmp_path / "demo.trace.json").read_text())["traceEvents"]
    processes = {e["args"]["name"].split(" (")[0] for e in trace if e.get("name") == "process_name"}
    assert set(names) <= processes
    assert (tmp_path / "demo.png").stat().st_size > 0
