"""The ways in that need no rewrite: the import swap (verl's legacy ``RayPPOTrainer``) and the entry point's config.

The recipe test runs verl's legacy trainer for 2 GRPO steps on the CPU (real Ray, FSDP2 workers, agent loop, CPU
rollout replicas) and checks that it learns and syncs weights exactly: about two minutes. The rest runs without Ray.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from jigsaw_verl.integration.settings import JigsawSettings, packaged_defaults
from jigsaw_verl.integration.trainer.import_swap import LEGACY_MAIN, ImportSwapError, swapped_source
from jigsaw_verl.integration.trainer.timing import CORE_STAGE, StageTimer

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "legacy_dropin"
VERL_IMPORT = "from verl.trainer.ppo.ray_trainer import RayPPOTrainer"
JIGSAW_IMPORT = "from jigsaw_verl.trainer import RayPPOTrainer"
MAX_RESPONSE = 24  # data.max_response_length in recipes/cpu_tiny_grpo.sh


def _run(args: list[str], timeout: int = 120, **env) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=ROOT, env=dict(os.environ, **env), capture_output=True, text=True, timeout=timeout)


def test_swapped_recipe_differs_from_verl_by_the_import_line_only():
    verl_text = Path(importlib.util.find_spec(LEGACY_MAIN).origin).read_text().splitlines()
    swapped = swapped_source()  # what the recipe runs, produced from the installed verl
    diff = difflib.unified_diff(verl_text, swapped.splitlines(), lineterm="", n=0)
    changed = [line for line in diff if line[:1] in "+-" and line[:3] not in ("---", "+++")]
    assert changed == ["-" + VERL_IMPORT, "+" + JIGSAW_IMPORT]
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "main_ppo_v0.py" not in tracked, "the repository carries no copy of verl's file"


def test_swap_refuses_a_source_without_the_line_naming_the_module():
    with pytest.raises(ImportSwapError, match=r"main_ppo\.py \(verl .*\) holds the line .* 0 times, not once"):
        swapped_source("verl.trainer.main_ppo", old="from verl.nowhere import RayPPOTrainer")


def test_dropin_subclasses_verl_trainer_and_copies_no_loop():
    code = (
        "import sys, jigsaw_verl.trainer; light = 'verl' not in sys.modules\n"
        "from jigsaw_verl.trainer import RayPPOTrainer as J\n"
        "from verl.trainer.ppo.ray_trainer import RayPPOTrainer as V\n"
        "print(light, issubclass(J, V), J.__name__, 'fit' in vars(J))"
    )
    out = _run([sys.executable, "-c", code]).stdout.split()
    assert out == ["True", "True", "RayPPOTrainer", "False"]  # lazy package import; verl's fit runs unchanged


def test_stage_timer_sums_sub_stages_and_gives_core_stage_timings():
    timer = StageTimer("p", gpus=2)
    calls = []
    timer.on_step = lambda step, s: calls.append((step, sorted(s)))
    timer.begin_step()
    for name in ("rollout", "old_log_prob", "ref_log_prob", "update_actor", "weight_sync", "update_actor"):
        with timer.stage(name), timer.stage("nested"):  # a stage inside another is not counted twice
            pass
    seconds = timer.end_step(1)
    assert set(seconds) == {"rollout", "old_log_prob", "ref_log_prob", "update_actor", "weight_sync", "step"}
    assert sum(v for k, v in seconds.items() if k != "step") <= seconds["step"]
    assert [(t.step, t.stage, t.gpus) for t in timer.timings] == [
        (1, CORE_STAGE["rollout"], 2), (1, "logprob", 2), (1, "update", 2), (1, "weight_sync", 2),
    ]  # fmt: skip
    assert all(t.end_s >= t.start_s for t in timer.timings) and calls == [(1, sorted(seconds))]


def test_legacy_recipe_trains_two_steps_with_stage_timings(tmp_path):
    """verl's own training loop (the legacy ``RayPPOTrainer.fit``, unchanged) end to end on the CPU backend: real Ray,
    FSDP2 workers, agent loop and CPU rollout replicas. GRPO learns (the weights move every step and each replica
    holds exactly the actor's weights after every sync), and the drop-in's stage timings agree with verl's."""
    metrics_file, audit = tmp_path / "metrics.jsonl", tmp_path / "weights.jsonl"
    r = _run(
        ["bash", "recipes/cpu_tiny_grpo_legacy.sh", "trainer.total_training_steps=2", "trainer.logger=[console,file]"],
        timeout=900, OUT=str(tmp_path / "run"), VERL_FILE_LOGGER_PATH=str(metrics_file),
        JIGSAW_VERL_WEIGHT_AUDIT=str(audit),
    )  # fmt: skip
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    assert "TaskRunner hostname" in r.stdout + r.stderr  # the recipe's legacy TaskRunner ran, not the V1 one
    steps = {rec["step"]: rec["data"] for rec in map(json.loads, metrics_file.read_text().splitlines())}
    assert sorted(steps) == [1, 2]
    for m in steps.values():
        assert 0.0 <= m["critic/score/min"] <= m["critic/score/mean"] <= m["critic/score/max"] <= 1.0
        stages = {k.removeprefix("jigsaw/stage_s/"): v for k, v in m.items() if k.startswith("jigsaw/stage_s/")}
        for stage in ("rollout", "old_log_prob", "ref_log_prob", "update_actor", "weight_sync", "step"):
            assert stages[stage] > 0, (stage, stages)
        assert sum(v for k, v in stages.items() if k != "step") <= stages["step"]
        # each agrees with verl's own timer around the same call
        for ours, verls in (("old_log_prob", "old_log_prob"), ("ref_log_prob", "ref"),
                            ("update_actor", "update_actor"), ("weight_sync", "update_weights")):  # fmt: skip
            assert abs(stages[ours] - m[f"timing_s/{verls}"]) <= 0.05 + 0.05 * m[f"timing_s/{verls}"], (ours, m)
        assert stages["rollout"] + stages["rollout_sleep"] <= m["timing_s/gen"] + 0.05
        assert 0 < m["response_length/min"] <= m["response_length/max"] <= MAX_RESPONSE
    # GRPO had signal (some groups mixed right and wrong answers), so the update moved the actor
    assert any(m["actor/grad_norm"] > 0 for m in steps.values())
    syncs = [json.loads(line) for line in audit.read_text().splitlines()]
    assert {(s["replica"], s["global_steps"]) for s in syncs} == {(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)}
    for s in syncs:
        assert s["rollout"] == s["actor"], s  # after each sync the replica holds exactly the actor's weights
    by_step = {s["global_steps"]: s["actor"] for s in syncs}
    assert by_step[0] != by_step[1] != by_step[2]  # the actor's weights changed at every step


def test_cfg_job_prints_verl_config_and_jigsaw_group():
    r = _run([sys.executable, "-m", "jigsaw_verl.main_ppo", "--cfg", "job"])
    assert r.returncode == 0, r.stderr[-2000:]
    cfg = yaml.safe_load(r.stdout)
    assert {"actor_rollout_ref", "critic", "data", "algorithm", "trainer", "reward"} <= set(cfg)
    assert cfg["jigsaw"] == packaged_defaults() and cfg["jigsaw"]["enable"] is False  # the group, as the YAML has it
    assert JigsawSettings.from_config(cfg) == JigsawSettings.from_config(None)
    assert "ray init" not in r.stdout + r.stderr


def test_unknown_jigsaw_override_is_one_line_and_exit_2():
    r = _run([sys.executable, "-m", "jigsaw_verl.main_ppo", "jigsaw.foo=1"])
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and len(lines) == 1 and "jigsaw.foo" in lines[0]


def test_legacy_recipe_refuses_migration_before_ray():
    r = _run([sys.executable, str(RECIPE / "main.py"), "jigsaw.migration.enable=true", "trainer.use_v1=false"])
    assert r.returncode == 2 and "jigsaw.migration.enable" in r.stderr and "ray init" not in r.stdout + r.stderr
