"""Two tiny GRPO pipelines multiplexed on one pool of 2 CPU slots by the live scheduler (``jigsaw-verl mux``).

Multiplexing changes when things run, never what is computed: each pipeline, run alone with verl's own trainer
and run multiplexed, generates the same responses and gets the same per-step rewards (greedy-free sampling is
seeded per request under ``rollout.full_determinism``), and its losses agree within 1e-4 relative. Every run is
real: verl's trainer, Ray, FSDP2, the CPU rollout replicas; the multiplexed one adds the launcher's Ray cluster,
the group's scheduler actor and the ``jigsaw`` trainer mode's stage leases.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "cpu_tiny_grpo.sh"
STEPS = 3
COMMON = ["trainer.logger=[console,file]", f"trainer.total_training_steps={STEPS}"]
# two pipelines that differ in their sampling seed
PIPELINES = {"a": ["actor_rollout_ref.rollout.seed=7"], "b": ["actor_rollout_ref.rollout.seed=11"]}
LOSSES = ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm")


def _env(**extra) -> dict:
    return dict(os.environ, PY=sys.executable, **extra)


def _overrides(name: str, out: Path) -> list[str]:
    return [*COMMON, *PIPELINES[name], f"trainer.rollout_data_dir={out / name / 'rollouts'}"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each pipeline alone (back to back), then both multiplexed; wall times measured side by side."""
    out = tmp_path_factory.mktemp("mux")
    walls = {}
    metrics = {}
    for name in PIPELINES:
        log = out / f"alone-{name}.log"
        started = time.perf_counter()
        with log.open("w") as fh:
            rc = subprocess.run(
                ["bash", str(RECIPE), *_overrides(name, out / "alone")],
                env=_env(OUT=str(out / "alone" / name), VERL_FILE_LOGGER_PATH=str(out / f"alone-{name}.jsonl")),
                stdout=fh,
                stderr=subprocess.STDOUT,
                timeout=900,
            ).returncode
        walls[f"alone-{name}"] = time.perf_counter() - started
        assert rc == 0, log.read_text()[-3000:]
        metrics[("alone", name)] = out / f"alone-{name}.jsonl"
    recipes = [" ".join([str(RECIPE), *_overrides(name, out / "mux")]) for name in PIPELINES]
    started = time.perf_counter()
    mux_log = out / "mux.log"
    with mux_log.open("w") as fh:
        rc = subprocess.run(
            [sys.executable, "-m", "jigsaw_verl.cli", "mux", *recipes, "--out", str(out / "mux"), "--pool-slots", "2"],
            env=_env(),
            stdout=fh,
            stderr=subprocess.STDOUT,
            timeout=1200,
        ).returncode
    walls["mux"] = time.perf_counter() - started
    assert rc == 0, mux_log.read_text()[-3000:] + "".join(p.read_text()[-2000:] for p in (out / "mux").glob("*.log"))
    for i, name in enumerate(PIPELINES):
        metrics[("mux", name)] = out / "mux" / f"p{i}-{RECIPE.stem}.metrics.jsonl"
    back_to_back = walls["alone-a"] + walls["alone-b"]
    print(
        f"\nwall: alone a {walls['alone-a']:.0f} s + alone b {walls['alone-b']:.0f} s = {back_to_back:.0f} s "
        f"back to back; multiplexed {walls['mux']:.0f} s ({back_to_back / walls['mux']:.2f}x)"
    )
    return {"out": out, "walls": walls, "metrics": metrics, "mux_log": mux_log.read_text()}


def _steps(path: Path) -> dict[int, dict]:
    return {row["step"]: row["data"] for row in map(json.loads, path.read_text().splitlines())}


def _rollouts(folder: Path) -> dict[int, list[tuple]]:
    out = {}
    for f in sorted(folder.glob("*.jsonl")):
        rows = [json.loads(line) for line in f.read_text().splitlines()]
        out[int(f.stem)] = [(r["uid"], r["input"], r["output"], r["score"]) for r in rows]
    return out


@pytest.mark.parametrize("name", list(PIPELINES))
def test_multiplexed_pipeline_computes_what_it_computes_alone(runs, name):
    alone = _rollouts(runs["out"] / "alone" / name / "rollouts")
    mux = _rollouts(runs["out"] / "mux" / name / "rollouts")
    assert sorted(alone) == sorted(mux) == list(range(1, STEPS + 1))
    for step in alone:
        assert len(alone[step]) == 8 * 4
        assert mux[step] == alone[step], f"{name} step {step}: responses or rewards differ"
    a, m = _steps(runs["metrics"][("alone", name)]), _steps(runs["metrics"][("mux", name)])
    assert sorted(a) == sorted(m) == list(range(1, STEPS + 1))
    for step in a:
        assert m[step]["critic/score/mean"] == a[step]["critic/score/mean"]
        assert m[step]["response_length/mean"] == a[step]["response_length/mean"]
        for key in LOSSES:
            assert m[step][key] == pytest.approx(a[step][key], rel=1e-4, abs=1e-7), (step, key)
        # the multiplexed run really ran under leases: it logged how long each stage waited for its grant
        assert "jigsaw/lease_wait_s/rollout" in m[step] and "jigsaw/lease_wait_s/rollout" not in a[step]


def test_leases_never_oversubscribe_the_pool(runs):
    trace = json.loads((runs["out"] / "mux" / "mux.trace.json").read_text())["traceEvents"]
    slices = [e for e in trace if e.get("ph") == "X"]
    pipelines = {e["name"].split("/")[0] for e in slices}
    assert len(pipelines) == 2
    for p in pipelines:
        stages = {tuple(e["name"].split("/")[1:]) for e in slices if e["name"].startswith(p + "/")}
        for step in range(STEPS):
            assert {(str(step), s) for s in ("rollout", "logprob", "update", "weight_sync")} <= stages, (p, stages)
    leases = json.loads((runs["out"] / "mux" / "leases.json").read_text())
    assert {x["pipeline"] for x in leases} == pipelines
    for slot in {g for lease in leases for g in lease["gpus"]}:
        mine = [x for x in leases if slot in x["gpus"]]
        for t in sorted({x["start_s"] for x in mine}):  # the held shares only change when a lease starts
            held = sum(x["sm_share"] for x in mine if x["start_s"] <= t < x["end_s"])
            assert held <= 1.0 + 1e-9, f"slot {slot} oversubscribed at {t:.2f} s: {held}"
    assert (runs["out"] / "mux" / "mux.png").stat().st_size > 0
    assert "mux: done in" in runs["mux_log"]
