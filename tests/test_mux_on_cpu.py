"""Two tiny GRPO pipelines multiplexed on one pool of 2 CPU slots by the live scheduler (``jigsaw-verl mux``): one
from the bundled CPU recipe, one from a script written the way verl's examples are (``python3 -m
verl.trainer.main_ppo`` with ``trainer.total_epochs`` and no step count, nothing of ours in it), with only CPU-size
overrides appended.

Multiplexing changes when things run, never what is computed: each pipeline, run alone (verl's V1 trainer in mode
``jigsaw``, no group, through the bundled recipe) and run multiplexed, generates the same responses and gets the
same per-step rewards (sampling is seeded per request under ``rollout.full_determinism``), and its losses agree
within 1e-4 relative; for the verl-style script that also shows it ran with the settings the overrides gave it and
the step count verl's rule gives (24 rows // 8 prompts x 1 epoch = 3). Every run is real: verl's trainer, Ray,
FSDP2, the CPU rollout replicas; the multiplexed one adds the launcher's Ray cluster, the group's scheduler actor,
the shared placement group and the stage leases. (Trainer mode ``jigsaw`` puts each step's samples in a canonical
order, by prompt and response tokens, before training; verl's own sync trainer orders them by finishing time, which
varies from run to run even alone, and the losses then differ by float rounding amplified by Adam: about 1e-3 by
step 3. In the canonical order two alone runs give bit-identical losses.) A second launcher run is stopped with
Ctrl-C (SIGINT to its process group) and leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from tiny_pipelines import LOSSES, PIPELINES, RECIPE, STEPS, VALIDATIONS
from tiny_pipelines import env as _env
from tiny_pipelines import overrides as _overrides
from tiny_pipelines import rollouts as _rollouts
from tiny_pipelines import steps as _steps
from verl_style import VERL_STYLE, cpu_size_overrides

from jigsaw_verl.integration.cpu.assets import build_tiny_assets
from jigsaw_verl.pool.ledger import engines_awake_outside_leases

MIGRATION_METRICS = (
    "jigsaw/migrations",
    "jigsaw/migrated_requests",
    "jigsaw/reprefill_tokens",
    "jigsaw/freed_replica_s",
)


def _mux_recipes(out: Path) -> list[str]:
    """a through the bundled recipe, b through the verl-style script with the CPU-size overrides."""
    a = [str(RECIPE), f"trainer.total_training_steps={STEPS}", *_overrides("a", out)]
    # the script reserves 0.6 of each slot for its engine, as verl's examples do; two engines fit one slot at 0.4
    # each (the group's memory rule refuses 0.6 before Ray)
    b = [
        str(VERL_STYLE),
        *cpu_size_overrides(),
        *_overrides("b", out),
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
    ]
    return [" ".join(a), " ".join(b)]


MUX_NAMES = ("p0-cpu_tiny_grpo", "p1-verl_style_grpo")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, alone_runs):
    """Each pipeline alone (the session's ``alone_runs``), then both multiplexed. (The wall-time comparison of the
    two is a benchmark's job, not this test's.)"""
    out = tmp_path_factory.mktemp("mux")
    walls = {}
    metrics = {("alone", name): path for name, path in alone_runs["metrics"].items()}
    started = time.perf_counter()
    mux_log = out / "mux.log"
    with mux_log.open("w") as fh:
        rc = subprocess.run(
            [sys.executable, "-m", "jigsaw_verl.cli", "mux", *_mux_recipes(out / "mux"), "--out", str(out / "mux"),
             "--pool-slots", "2"],
            env=_env(),
            stdout=fh,
            stderr=subprocess.STDOUT,
            timeout=1200,
        ).returncode  # fmt: skip
    walls["mux"] = time.perf_counter() - started
    logs = {p.stem: p.read_text() for p in (out / "mux").glob("*.log")}
    assert rc == 0, mux_log.read_text()[-3000:] + "".join(text[-2000:] for text in logs.values())
    for name, pipeline in zip(PIPELINES, MUX_NAMES, strict=True):
        metrics[("mux", name)] = out / "mux" / f"{pipeline}.metrics.jsonl"
    print(f"\nmultiplexed run (launcher, pre-Ray checks, both pipelines): {walls['mux']:.0f} s")
    return {
        "out": out,
        "alone": alone_runs,
        "walls": walls,
        "metrics": metrics,
        "mux_log": mux_log.read_text(),
        "logs": logs,
    }


def test_the_verl_style_script_ran_verls_entry_point_through_the_plugin_with_verls_step_rule(runs):
    log = runs["logs"]["p1-verl_style_grpo"]
    assert "python3 -m verl.trainer.main_ppo" in log  # the script's own command line (set -x)
    assert "24 rows // 8 prompts x 1 epochs" in runs["mux_log"]  # the launcher's pre-Ray check: verl's rule
    assert "p1-verl_style_grpo: model, 8 prompts x 4, 3 steps" in runs["mux_log"]


@pytest.mark.parametrize("name", list(PIPELINES))
def test_multiplexed_pipeline_computes_what_it_computes_alone(runs, name):
    alone = _rollouts(runs["alone"]["rollouts"][name])
    mux = _rollouts(runs["out"] / "mux" / name / "rollouts")
    assert sorted(alone) == sorted(mux) == list(range(1, STEPS + 1))
    for step in alone:
        assert len(alone[step]) == 8 * 4
        assert mux[step] == alone[step], f"{name} step {step}: responses or rewards differ"
    a, m = _steps(runs["metrics"][("alone", name)]), _steps(runs["metrics"][("mux", name)])
    # a validation before training logs its metrics at step 0
    assert sorted(a) == sorted(m) == [0] * (0 in VALIDATIONS[name]) + list(range(1, STEPS + 1))
    for step in VALIDATIONS[name]:
        assert any(k.startswith("val-") for k in m[step]) and any(k.startswith("val-") for k in a[step]), step
    a.pop(0, None)
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
    for p, name in zip(MUX_NAMES, PIPELINES, strict=True):
        stages = {tuple(e["name"].split("/")[1:]) for e in slices if e["name"].startswith(p + "/")}
        # each step's stages; the syncs that precede each rollout (-1: the first); start-up and validations
        graph = {(str(step), s) for step in range(STEPS) for s in ("rollout", "logprob", "update")}
        graph |= {(str(step - 1), "weight_sync") for step in range(STEPS)} | {("-1", "init")}
        graph |= {(str(v - 1), "validate") for v in VALIDATIONS[name]}
        assert stages == graph, (p, stages ^ graph)
    leases = json.loads((runs["out"] / "mux" / "leases.json").read_text())
    assert {x["pipeline"] for x in leases} == pipelines
    for slot in {g for lease in leases for g in lease["gpus"]}:
        mine = [x for x in leases if slot in x["gpus"]]
        for t in sorted({x["start_s"] for x in mine}):  # the held shares only change when a lease starts
            held = sum(x["sm_share"] for x in mine if x["start_s"] <= t < x["end_s"])
            assert held <= 1.0 + 1e-9, f"slot {slot} oversubscribed at {t:.2f} s: {held}"
    assert (runs["out"] / "mux" / "mux.png").stat().st_size > 0
    assert "mux: done in" in runs["mux_log"]
    assert "'p0-cpu_tiny_grpo': 0, 'p1-verl_style_grpo': 0" in runs["mux_log"]


def test_pipelines_share_one_placement_group_and_move_state_with_their_leases(runs):
    """Both pipelines' workers ran in the pool's one placement group (the scheduler's), none in one of their own;
    each step moved the training state on at its log-prob, update and weight-sync leases and off at their ends
    (on the CPU the move is host to host; the calls are verl's ``to`` on the worker groups)."""
    pool = json.loads((runs["out"] / "mux" / "pool.json").read_text())
    assert pool["num_slots"] == 2 and pool["max_colocate_count"] == 3 * 2  # two recipes given to the launcher
    assert sorted(pool["pipelines"]) == list(MUX_NAMES)
    (node,) = pool["nodes"]  # one node: one placement group, both slots
    assert node["slots"] == [0, 1] and pool["slots_per_node"] == 2 and pool["lost_nodes"] == []
    for name, workers in pool["pipelines"].items():
        assert len(workers) == 2  # trainer.n_gpus_per_node=2: one worker per slot
        assert {w["placement_group_id"] for w in workers} == {node["placement_group_id"]}
        assert {w["node_id"] for w in workers} == {node["node_id"]}
        assert sorted(w["bundle"] for w in workers) == pool["homes"][name] == [0, 1]
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
            # weight sync, log-prob, update; a validation just before (its sync's); step 1: the start-up's offload
            validated = step - 1 in VALIDATIONS[name]
            assert m[step]["jigsaw/onloads"] == 3 + validated, m[step]
            assert m[step]["jigsaw/offloads"] == 3 + validated + (step == 1), m[step]
        a = _steps(runs["metrics"][("alone", name)])
        assert "jigsaw/onloads" not in a[1]  # alone (no group) nothing moves


def test_ledger_every_byte_is_charged_and_no_slot_ever_exceeds_its_memory(runs):
    """The multiplexed run against the CPU backend's device-memory ledger (``memory.json``): both pipelines'
    engines (one replica per slot) and their actors' parameters, gradients and optimizer state were charged where
    they live, no slot ever held more than its memory (a charge over it would have failed the run, as CUDA's
    allocator fails), everything was released when the pipelines left, and the trace has a memory track per
    slot."""
    memory = json.loads((runs["out"] / "mux" / "memory.json").read_text())
    events = memory["events"]
    capacity = memory["capacity_bytes"]
    assert capacity > 0 and memory["slots"] == 2
    for name in MUX_NAMES:
        holders = {(e["slot"], e["holder"]) for e in events if e["pipeline"] == name and e["held_bytes"] > 0}
        for rank in (0, 1):
            parts = {f"engine/r{rank}", *(f"actor/rank{rank}/{p}" for p in ("params", "grads", "optim"))}
            assert parts <= {h for slot, h in holders if slot == rank}, (name, rank, holders)
    assert all(e["slot_bytes"] <= capacity * (1 + 1e-9) for e in events)
    assert max(memory["peak_bytes"]) <= capacity * (1 + 1e-9)
    last = {e["slot"]: e["slot_bytes"] for e in events}
    assert last == {0: 0.0, 1: 0.0}, last
    trace = json.loads((runs["out"] / "mux" / "mux.trace.json").read_text())["traceEvents"]
    assert {e["name"] for e in trace if e.get("ph") == "C"} == {"slot 0 memory", "slot 1 memory"}


def test_ledger_no_engine_is_awake_outside_its_pipelines_leases_and_start_ups_never_overlap(runs):
    """Every stretch in which a rollout engine held device memory lies inside its pipeline's leases on that slot
    (start-up; the sync handing over to its rollout; validations): verl's end-of-step sync no longer leaves the
    engines awake on slots granted to the other pipeline, and a migrated-from replica goes back asleep. The two
    pipelines' start-ups (engine launch and memory profiling) never overlap on their shared slots."""
    memory = json.loads((runs["out"] / "mux" / "memory.json").read_text())
    leases = json.loads((runs["out"] / "mux" / "leases.json").read_text())
    assert engines_awake_outside_leases(memory, leases) == []
    engine = [e for e in memory["events"] if e["holder"].startswith("engine/")]
    assert {e["pipeline"] for e in engine if e["held_bytes"] > 0} == set(MUX_NAMES)
    inits = sorted((x["start_s"], x["end_s"], tuple(x["gpus"])) for x in leases if x["stage"] == "init")
    assert len(inits) == 2 and inits[0][2] == inits[1][2] == (0, 1), inits  # alone on the shared slots
    assert inits[0][1] <= inits[1][0], inits


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["trainer.n_gpus_per_node=4", "trainer.experiment_name=big", "jigsaw.mux.pool_slots=2"],
         "jigsaw.mux.slots: pipeline 'big' needs 4 slots"),
        (["jigsaw.mux.group=null"], "jigsaw.enable=true needs jigsaw.mux.group"),
        (["jigsaw.mux.policy=fastest"], "jigsaw.mux.policy='fastest' is unknown"),
        (["trainer.nnodes=2", "trainer.n_gpus_per_node=1", "jigsaw.mux.pool_slots=2"],
         "trainer.nnodes=2: pipeline 'gsm8k' spans more nodes than the pool of group 'g' has (1 node(s) x 2 slot(s)"),
        (["trainer.nnodes=2", "trainer.n_gpus_per_node=2", "jigsaw.mux.pool_nodes=3"],
         "jigsaw.mux.pool_nodes=3: a pool of 4 slots cannot be cut into 3 equal nodes"),
        (["trainer.nnodes=2", "trainer.n_gpus_per_node=2", "actor_rollout_ref.rollout.tensor_model_parallel_size=4"],
         "actor_rollout_ref.rollout.tensor_model_parallel_size=4: the rollout replicas of pipeline 'gsm8k' cannot "
         "be placed on the pool of group 'g', 2 node(s) x 2 slot(s)"),
        (["reward.reward_model.enable_resource_pool=true"], "reward.reward_model.enable_resource_pool=true"),
        (["jigsaw.mux.slots=1", "jigsaw.mux.pool_slots=1", "trainer.n_gpus_per_node=2"],
         "trainer.n_gpus_per_node=2: pipeline"),
        (["jigsaw.mux.max_pipelines=0"], "jigsaw.mux.max_pipelines=0"),
    ],
)  # fmt: skip
def test_bad_pipeline_gets_one_line_before_ray(overrides, message):
    """The entry point's checks on the config hydra composes for it (in this process: one verl import for all)."""
    from hydra import compose, initialize_config_dir

    from jigsaw_verl.integration.main_ppo import check_jigsaw_config
    from jigsaw_verl.integration.settings import CONFIG_FILE, JigsawConfigError

    with initialize_config_dir(config_dir=str(CONFIG_FILE.parent), version_base=None):
        config = compose(config_name="jigsaw_ppo_trainer", overrides=[*_group_args(), *overrides])
    with pytest.raises(JigsawConfigError) as err:
        check_jigsaw_config(config)
    assert message in str(err.value) and "\n" not in str(err.value)


def _group_args() -> list[str]:
    model = f"actor_rollout_ref.model.path={build_tiny_assets().model}"
    return ["jigsaw.enable=true", "jigsaw.mux.group=g", "trainer.total_training_steps=3", model]


def test_the_entry_point_says_it_in_one_line_and_exit_2_before_ray():
    args = [*_group_args(), "trainer.nnodes=2", "trainer.n_gpus_per_node=1", "jigsaw.mux.pool_slots=2"]
    r = subprocess.run(
        [sys.executable, "-m", "jigsaw_verl.main_ppo", *args], env=_env(), capture_output=True, text=True
    )
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0] == (
        "jigsaw_verl.main_ppo: error: trainer.nnodes=2: pipeline 'gsm8k' spans more nodes than the pool of group 'g' "
        "has (1 node(s) x 2 slot(s); jigsaw.mux.pool_nodes)"
    )
    assert "ray init" not in r.stdout


def _joined(log: Path) -> set[str]:
    """The pipelines the launcher's progress lines show in the group (their step count known: they joined, so their
    driver, task runner and Ray workers exist), and not exited."""
    joined = set()
    for line in log.read_text().splitlines():
        for name in ("p0-cpu_tiny_grpo", "p1-cpu_tiny_grpo"):
            if f"mux: {name} " in line and "] " in line:
                state = line.rsplit("] ", 1)[-1]  # "3/50 rollout of step 3", "0/? starting", "32/50 exit 0"
                (joined.add if "/?" not in state and "exit" not in state else joined.discard)(name)
    return joined


def test_ctrl_c_stops_every_pipeline_the_scheduler_and_ray_within_30_s(tmp_path):
    recipes = [f"{RECIPE} trainer.total_training_steps=50 actor_rollout_ref.rollout.seed={s}" for s in (7, 11)]
    log = tmp_path / "launcher.log"
    args = [sys.executable, "-m", "jigsaw_verl.cli", "mux", *recipes, "--out", str(tmp_path / "mux")]
    with log.open("w") as fh:
        # a process group of its own, as a terminal's foreground job: Ctrl-C sends SIGINT to that group
        launcher = subprocess.Popen(args, env=_env(), stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    tree: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 600
        while _joined(log) != {"p0-cpu_tiny_grpo", "p1-cpu_tiny_grpo"}:
            assert launcher.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        tree = psutil.Process(launcher.pid).children(recursive=True)
        assert len(tree) > 10  # Ray's processes, two pipelines' drivers and their workers
        os.killpg(launcher.pid, signal.SIGINT)
        interrupted = time.monotonic()
        rc = launcher.wait(timeout=30)  # the launcher is reaped here (psutil would take its exit status)
        gone, alive = psutil.wait_procs(tree, timeout=max(0.0, 30 - (time.monotonic() - interrupted)))
        elapsed = time.monotonic() - interrupted
        print(f"\nCtrl-C: the launcher and {len(tree)} processes of the group gone in {elapsed:.1f} s")
        assert not alive, [(p.pid, p.name()) for p in alive]
        assert rc == 130
        text = log.read_text()
        assert "mux: interrupted after" in text and "the group's scheduler and Ray" in text, text[-2000:]
    finally:
        for proc in [p for p in tree if p.is_running()]:
            proc.kill()
        if launcher.poll() is None:
            launcher.kill()
