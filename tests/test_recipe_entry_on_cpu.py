"""verl recipes as written, before Ray: the entry-point shims, ``jigsaw-verl check``, the launcher's refusal of a group
it cannot run, hub model ids in the local Hugging Face cache, and the step count by verl's rule. No Ray starts here
(each check composes verl's config in a subprocess: seconds)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf
from verl_style import VERL_STYLE, cpu_size_overrides

from jigsaw_verl.integration.cpu.assets import build_tiny_assets
from jigsaw_verl.integration.model_lookup import find_model_config
from jigsaw_verl.integration.settings import JigsawConfigError
from jigsaw_verl.integration.step_count import planned_steps
from jigsaw_verl.runtime.recipe_entry import write_shims

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "cpu_tiny_grpo.sh"


def _cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "jigsaw_verl.cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def _errors(r: subprocess.CompletedProcess) -> list[str]:
    return [line for line in r.stderr.splitlines() if line.startswith("jigsaw-verl: error: ")]


def test_shims_swap_verls_entry_point_and_pass_everything_else(tmp_path):
    shims = write_shims(tmp_path / "bin")
    show = "import sys; print(sys.argv[1:])"
    for name in ("python", "python3"):
        out = subprocess.run(
            [str(shims / name), "-c", show, "-m", "verl.trainer.main_ppo", "a=1"], capture_output=True, text=True
        ).stdout
        assert out.strip() == "['-m', 'jigsaw_verl.main_ppo', 'a=1']"
        out = subprocess.run(
            [str(shims / name), "-c", show, "-m", "verl.trainer.main_ppo_v0"], capture_output=True, text=True
        ).stdout
        assert out.strip() == "['-m', 'verl.trainer.main_ppo_v0']"  # another entry point is left alone


def test_check_accepts_a_verl_style_script_with_epochs_and_gives_verls_step_count():
    r = _cli("check", str(VERL_STYLE), *cpu_size_overrides())
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"{VERL_STYLE}: can join a multiplexing group" in r.stdout
    assert (
        "steps: 3 (24 rows // 8 prompts x 1 epochs (at most: data.filter_overlong_prompts may drop rows))" in r.stdout
    )
    spec = json.loads(r.stdout[r.stdout.index("{") :])
    assert spec["steps"] == 3 and spec["batch_prompts"] == 8 and spec["group_size"] == 4 and spec["ref_model"]


def test_check_refuses_every_problem_of_a_recipe_in_one_line_each_within_seconds():
    started = time.perf_counter()
    r = _cli("check", "--pool-slots", "2", str(VERL_STYLE))  # as written: a hub id not in the cache, 8 GPUs
    took = time.perf_counter() - started
    errors = _errors(r)
    assert r.returncode == 2 and len(errors) >= 3, r.stderr[-3000:]
    prefix = f"jigsaw-verl: error: {VERL_STYLE}: "
    assert any(
        e.startswith(prefix + "actor_rollout_ref.model.path='Qwen/Qwen3-8B' is not in the local Hugging")
        for e in errors
    )
    assert any(e.startswith(prefix + "data.train_files: ") and "set trainer.total_training_steps" in e for e in errors)
    assert any(e.startswith(prefix + "jigsaw.mux.slots: pipeline 'qwen3_8b_grpo' needs 8 slots") for e in errors)
    print(f"\ncheck refused the verl-style script as written in {took:.1f} s")
    assert "ray init" not in r.stdout


def test_check_takes_its_options_after_the_recipe_and_a_config_hydra_refuses_is_one_line():
    """Options may follow the recipe among its overrides (they used to become hydra overrides and the check
    crashed on the placeholder verdict); an override hydra cannot compose is one line naming what it said."""
    r = _cli("check", str(RECIPE), "--policy", "areal", "trainer.total_training_steps=3")
    errors = _errors(r)
    assert r.returncode == 2 and len(errors) == 1, r.stderr[-3000:]
    assert "jigsaw.mux.policy='areal' needs asynchronous execution" in errors[0] and "it can run: verl" in errors[0]
    r = _cli("check", str(RECIPE), "--no-such-option")
    errors = _errors(r)
    assert r.returncode == 2 and len(errors) == 1 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert errors[0].startswith(f"jigsaw-verl: error: {RECIPE}: hydra could not compose its config (exit 2): ")
    assert "--no-such-option" in errors[0]


@pytest.mark.parametrize(
    "script, message",
    [
        ("python3 -m pip --version", "the recipe never reached jigsaw_verl.main_ppo (it exited 0 without calling it)"),
        ("python3 -c 'import sys; sys.exit(3)'", "the recipe never reached jigsaw_verl.main_ppo (it exited 3 first"),
        ("python3 -m verl.trainer.main_ppo --config-name=ppo_megatron_trainer \"$@\"",
         "--config-name=ppo_megatron_trainer: jigsaw_verl.main_ppo composes verl's ppo_trainer config"),
    ],
)  # fmt: skip
def test_check_refuses_a_recipe_the_launcher_cannot_run_and_says_why(tmp_path, script, message):
    recipe = tmp_path / "recipe.sh"
    recipe.write_text(f"#!/usr/bin/env bash\nset -euo pipefail\n{script}\n")
    r = _cli("check", str(recipe))
    errors = _errors(r)
    assert r.returncode == 2 and len(errors) == 1 and message in errors[0], r.stderr[-3000:]


def test_the_launcher_refuses_a_group_it_cannot_run_before_ray(tmp_path):
    recipes = [str(RECIPE), f"{RECIPE} trainer.n_gpus_per_node=4"]
    r = _cli("mux", *recipes, "--out", str(tmp_path / "mux"), "--pool-slots", "2")
    errors = _errors(r)
    assert r.returncode == 2, r.stderr[-3000:]
    assert not any(e.startswith("jigsaw-verl: error: p0-") for e in errors)  # the good recipe has nothing to say
    assert f"jigsaw-verl: error: p1-cpu_tiny_grpo ({RECIPE} trainer.n_gpus_per_node=4): jigsaw.mux.slots:" in r.stderr
    assert len(errors) == 1
    assert "mux: started" not in r.stderr and not (tmp_path / "mux" / "pool.json").exists()  # nothing ran


def test_a_two_node_recipe_joins_a_two_node_pool_and_a_pool_the_cluster_cannot_hold_is_one_line(tmp_path):
    """``trainer.nnodes=2`` is accepted on a pool of two nodes (and refused on one); a pool that does not cut into
    its nodes, or one of several nodes with no cluster to join (no ``RAY_ADDRESS``), is one line and exit 2 before
    any recipe runs."""
    two = [str(RECIPE), "trainer.nnodes=2", "trainer.n_gpus_per_node=1"]
    ok = _cli("check", "--pool-slots", "2", "--pool-nodes", "2", *two)
    assert ok.returncode == 0 and "can join a multiplexing group" in ok.stdout, ok.stderr[-3000:]
    one = _cli("check", "--pool-slots", "2", *two)
    assert one.returncode == 2 and _errors(one) == [
        f"jigsaw-verl: error: {RECIPE}: trainer.nnodes=2: pipeline 'tiny_grpo' spans more nodes than the pool of "
        "group 'check' has (1 node(s) x 2 slot(s); jigsaw.mux.pool_nodes)"
    ], one.stderr[-3000:]
    out = str(tmp_path / "mux")
    uneven = _cli("mux", str(RECIPE), "--out", out, "--pool-slots", "3", "--pool-nodes", "2")
    assert uneven.returncode == 2 and _errors(uneven) == [
        "jigsaw-verl: error: --pool-nodes 2: the pool's 3 slots must cut into that many equal nodes"
    ], uneven.stderr[-3000:]
    local = _cli("mux", str(RECIPE), "--out", out, "--pool-slots", "2", "--pool-nodes", "2")
    assert local.returncode == 2 and len(_errors(local)) == 1 and "set RAY_ADDRESS" in local.stderr
    assert "mux: checking" not in local.stderr + uneven.stderr  # refused before any recipe ran


def test_engines_that_cannot_share_a_slot_are_refused_before_ray(tmp_path):
    """verl's examples reserve 0.6 of a device for the rollout engine: two such pipelines on the same slots are
    refused by the launcher in one line naming the key and the value that fits; one alone whose engine overfills a
    slot, or whose engine and the training state it pins there (``jigsaw.mux.offload=false``) do, is refused by
    the entry point's own check."""
    key = "actor_rollout_ref.rollout.gpu_memory_utilization"
    recipes = [f"{RECIPE} {key}=0.6", f"{RECIPE} {key}=0.6"]
    r = _cli("mux", *recipes, "--out", str(tmp_path / "mux"), "--pool-slots", "2")
    errors = _errors(r)
    assert r.returncode == 2 and len(errors) == 1, r.stderr[-3000:]
    assert errors[0].startswith(
        f"jigsaw-verl: error: the group's 2 pipelines: {key}: slot 0 holds 'p0-cpu_tiny_grpo' 0.6"
    )
    assert f"{key}=0.45 for each would fit" in errors[0]
    assert "mux: started" not in r.stderr and not (tmp_path / "mux" / "pool.json").exists()  # nothing ran
    alone = _cli("check", str(RECIPE), f"{key}=0.95")
    assert alone.returncode == 2 and _errors(alone) == [
        f"jigsaw-verl: error: {RECIPE}: {key}: slot 0 holds 'tiny_grpo' 0.95 of its memory, "
        f"0.95 in all, but 0.90 is usable (0.10 kept for contexts and activations); {key}=0.9 for each would fit"
    ], alone.stderr[-3000:]
    pinned = _cli("check", str(RECIPE), f"{key}=0.8", "jigsaw.mux.offload=false")
    assert pinned.returncode == 2 and _errors(pinned) == [
        f"jigsaw-verl: error: {RECIPE}: {key}: slot 0 holds 'tiny_grpo' 0.8 + 0.37 pinned of its memory, "
        f"1.17 in all, but 0.90 is usable (0.10 kept for contexts and activations); {key}=0.52 for each would fit"
    ], pinned.stderr[-3000:]
    fine = _cli("check", str(RECIPE))
    assert fine.returncode == 0 and f"two such pipelines share a slot at {key} <= 0.4" in fine.stdout


def test_a_hub_id_is_found_in_the_local_cache_without_the_network(tmp_path, monkeypatch):
    snapshot = tmp_path / "hub" / "models--org--tiny" / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text((build_tiny_assets().model / "config.json").read_text())
    (tmp_path / "hub" / "models--org--tiny" / "refs").mkdir()
    (tmp_path / "hub" / "models--org--tiny" / "refs" / "main").write_text("0123abcd")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    found = find_model_config("org/tiny")
    assert found.name == "tiny" and found.source == snapshot / "config.json" and found.config["num_hidden_layers"] == 2
    with pytest.raises(JigsawConfigError, match=r"'org/absent' is not in the local Hugging Face cache .*hf download"):
        find_model_config("org/absent")
    with pytest.raises(JigsawConfigError, match="neither a local model folder nor a Hugging Face model id"):
        find_model_config("hdfs://cluster/models/x")


def _steps_config(tmp_path: Path, rows: int, **data) -> OmegaConf:
    f = tmp_path / "train.parquet"
    pd.DataFrame({"prompt": [str(i) for i in range(rows)]}).to_parquet(f)
    return OmegaConf.create(
        {"trainer": {"total_training_steps": None, "total_epochs": 2},
         "data": {"train_files": [str(f), str(f)], "train_batch_size": 8, **data}}
    )  # fmt: skip


def test_steps_follow_verls_rule_over_the_data_files(tmp_path):
    count = planned_steps(_steps_config(tmp_path, 20))  # 40 rows // 8 x 2 epochs
    assert count.steps == 10 and count.how == "40 rows // 8 prompts x 2 epochs"
    assert planned_steps(_steps_config(tmp_path, 20, train_max_samples=17)).steps == 4  # 17 // 8 x 2
    config = _steps_config(tmp_path, 20)
    config.trainer.total_training_steps = 5
    assert planned_steps(config).steps == 5
    with pytest.raises(JigsawConfigError, match=r"^trainer.total_epochs=2 over 6 rows .* trains no step"):
        planned_steps(_steps_config(tmp_path, 3))
    config = _steps_config(tmp_path, 20)
    config.data.train_files = "hdfs://x/train.parquet"
    with pytest.raises(JigsawConfigError, match=r"^data.train_files: hdfs://x/train.parquet is not a local file"):
        planned_steps(config)


def test_a_group_its_policy_has_no_plan_for_is_refused_before_ray():
    from jigsaw_verl.model.catalogue import GPUS, MODELS
    from jigsaw_verl.model.slots import CPU_SLOT
    from jigsaw_verl.model.spec import LengthDist, PipelineSpec
    from jigsaw_verl.model.spec_record import spec_record
    from jigsaw_verl.model.topology import PoolTopology
    from jigsaw_verl.runtime.recipe_entry import RecipeCheck, group_policy_problem

    lengths = LengthDist(median=64.0, p99=256.0, max=256)
    specs = [
        PipelineSpec(name=n, model=MODELS["qwen3-4b"], prompt_len=lengths, response_len=lengths, steps=2)
        for n in ("a", "b")
    ]
    checks = [RecipeCheck(recipe=f"{s.name}.sh", problems=(), spec=spec_record(s)) for s in specs]
    homes = {"a": (0,), "b": (1,)}
    pool, h100 = PoolTopology(2, 2), GPUS["H100-80G"]
    # two 4B jobs on two H100s: the policies plan them
    assert group_policy_problem(checks, pool, h100, "jigsaw", homes) is None
    # on 8 GiB slots a 4B job's training state does not fit one slot (a static split has no plan), nor its KV cache
    problem = group_policy_problem(checks, pool, CPU_SLOT, "verl-split", homes)
    assert problem is not None and "jigsaw.mux.policy='verl-split' has no configuration" in problem, problem
    problem = group_policy_problem(checks, pool, CPU_SLOT, "jigsaw", homes)
    assert problem is not None and "cannot plan these pipelines on cpu-slot slots" in problem, problem
