"""Two tiny GRPO pipelines multiplexed on one pool of 2 CPU slots by the live scheduler (``jigsaw-verl mux``), with
a third that asks for more slots than the pool has and is refused without disturbing them.

Multiplexing changes when things run, never what is computed: each pipeline, run alone (verl's V1 trainer in mode
``jigsaw``, no group) and run multiplexed, generates the same responses and gets the same per-step rewards
(sampling is seeded per request under ``rollout.full_determinism``), and its losses agree within 1e-4 relative.
Every run is real: verl's trainer, Ray, FSDP2, the CPU rollout replicas; the multiplexed one adds the launcher's
Ray cluster, the group's scheduler actor, the shared placement group and the stage leases. (Trainer mode
``jigsaw`` puts each step's samples in a canonical order, by prompt and response tokens, before training; verl's
own sync trainer orders them by finishing time, which varies from run to run even alone, and the losses then
differ by float rounding amplified by Adam: about 1e-3 by step 3. In the canonical order two alone runs give
bit-identical losses.)
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
# two pipelines that differ in their sampling seed; b also consolidates its rollout tails (jigsaw.migration)
PIPELINES = {
    "a": ["actor_rollout_ref.rollout.seed=7"],
    "b": ["actor_rollout_ref.rollout.seed=11", "jigsaw.migration.enable=true"],
}
MIGRATION_METRICS = (
    "jigsaw/migrations",
    "jigsaw/migrated_requests",
    "jigsaw/reprefill_tokens",
    "jigsaw/freed_replica_s",
)
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
                ["bash", str(RECIPE), *_overrides(name, out / "alone"), "trainer.v1.trainer_mode=jigsaw"],
                env=_env(OUT=str(out / "alone" / name), VERL_FILE_LOGGER_PATH=str(out / f"alone-{name}.jsonl")),
                stdout=fh,
                stderr=subprocess.STDOUT,
                timeout=900,
            ).returncode
        walls[f"alone-{name}"] = time.perf_counter() - started
        assert rc == 0, log.read_text()[-3000:]
        metrics[("alone", name)] = out / f"alone-{name}.jsonl"
    recipes = [" ".join([str(RECIPE), *_overrides(name, out / "mux")]) for name in PIPELINES]
    recipes.append(f"{RECIPE} trainer.n_gpus_per_node=4")  # needs 4 slots of a 2-slot pool: refused, alone
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
    logs = {p.stem: p.read_text() for p in (out / "mux").glob("*.log")}
    # the launcher's exit code is the refused pipeline's; the other two finished (checked below)
    assert rc == 2, mux_log.read_text()[-3000:] + "".join(text[-2000:] for text in logs.values())
    assert "jigsaw.mux.slots: pipeline 'p2-cpu_tiny_grpo' needs 4 slots" in logs["p2-cpu_tiny_grpo"]
    for i, name in enumerate(PIPELINES):
        metrics[("mux", name)] = out / "mux" / f"p{i}-{RECIPE.stem}.metrics.jsonl"
    back_to_back = walls["alone-a"] + walls["alone-b"]
    print(
        f"\nwall: alone a {walls['alone-a']:.0f} s + alone b {walls['alone-b']:.0f} s = {back_to_back:.0f} s "
        f"back to back; multiplexed {walls['mux']:.0f} s ({back_to_back / walls['mux']:.2f}x)"
    )
    return {"out": out, "walls": walls, "metrics": metrics, "mux_log": mux_log.read_text(), "rc": rc}


def _steps(path: Path) -> dict[int, dict]:
    return {row["step"]: row["data"] for row in map(json.loads, path.read_text().splitlines())}


def _rollouts(folder: Path) -> dict[int, list[tuple]]:
    """Per step, every sample's prompt, response text and reward, sorted (uids are random per run)."""
    out = {}
    for f in sorted(folder.glob("*.jsonl")):
        rows = [json.loads(line) for line in f.read_text().splitlines()]
        out[int(f.stem)] = sorted((r["input"], r["output"], r["score"]) for r in rows)
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
        # trainer mode jigsaw logs the migration metrics every step, alone and multiplexed
        assert all(key in m[step] and key in a[step] for key in MIGRATION_METRICS)


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
    assert "'p0-cpu_tiny_grpo': 0, 'p1-cpu_tiny_grpo': 0, 'p2-cpu_tiny_grpo': 2" in runs["mux_log"]


def test_pipelines_share_one_placement_group_and_move_state_with_their_leases(runs):
    """Both pipelines' workers ran in the pool's one placement group (the scheduler's), none in one of their own;
    each step moved the training state on at its log-prob, update and weight-sync leases and off at their ends
    (on the CPU the move is host to host; the calls are verl's ``to`` on the worker groups)."""
    pool = json.loads((runs["out"] / "mux" / "pool.json").read_text())
    assert pool["num_slots"] == 2 and pool["max_colocate_count"] == 3 * 3  # three recipes given to the launcher
    assert sorted(pool["pipelines"]) == ["p0-cpu_tiny_grpo", "p1-cpu_tiny_grpo"]  # the refused one placed nothing
    for workers in pool["pipelines"].values():
        assert len(workers) == 2  # trainer.n_gpus_per_node=2: one worker per slot
        assert {w["placement_group_id"] for w in workers} == {pool["placement_group_id"]}
    # every rollout reported when each of its 32 responses finished (the predictor's live-batch curve)
    history = json.loads((runs["out"] / "mux" / "stage_times.json").read_text())
    rollouts = [h for h in history if h["stage"] == "rollout"]
    assert len(rollouts) == 2 * STEPS
    for h in rollouts:
        offsets = h["finish_offsets_s"]
        assert len(offsets) == 8 * 4 and offsets == sorted(offsets)
        assert 0 <= offsets[0] and offsets[-1] <= h["end_s"] - h["start_s"] + 0.5, h
    for name in PIPELINES:
        m = _steps(runs["metrics"][("mux", name)])
        for step in range(1, STEPS + 1):
            # log-prob, update, weight sync; step 1 also counts the offload right after start-up
            assert m[step]["jigsaw/onloads"] == 3 and m[step]["jigsaw/offloads"] == 3 + (step == 1), m[step]
        a = _steps(runs["metrics"][("alone", name)])
        assert "jigsaw/onloads" not in a[1]  # alone (no group) nothing moves


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["trainer.n_gpus_per_node=4", "trainer.experiment_name=big", "jigsaw.mux.pool_slots=2"],
         "jigsaw.mux.slots: pipeline 'big' needs 4 slots"),
        (["jigsaw.mux.group=null"], "jigsaw.enable=true needs jigsaw.mux.group"),
        (["jigsaw.mux.policy=fastest"], "jigsaw.mux.policy='fastest' is unknown"),
        (["trainer.nnodes=2", "trainer.n_gpus_per_node=1"], "trainer.nnodes=2: a multiplexing group's pool"),
        (["reward.reward_model.enable_resource_pool=true"], "reward.reward_model.enable_resource_pool=true"),
        (["jigsaw.mux.slots=1", "jigsaw.mux.pool_slots=1", "trainer.n_gpus_per_node=2"],
         "trainer.n_gpus_per_node=2: pipeline"),
        (["jigsaw.mux.max_pipelines=0"], "jigsaw.mux.max_pipelines=0"),
    ],
)  # fmt: skip
def test_bad_pipeline_gets_one_line_before_ray(overrides, message):
    args = ["jigsaw.enable=true", "jigsaw.mux.group=g", "trainer.total_training_steps=3", *overrides]
    r = subprocess.run(
        [sys.executable, "-m", "jigsaw_verl.main_ppo", *args], env=_env(), capture_output=True, text=True
    )
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and len(lines) == 1 and message in lines[0], r.stderr
    assert "ray init" not in r.stdout
