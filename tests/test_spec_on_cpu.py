"""Workload files: the bundled ones load; bad ones get one line naming file and key, exit code 2."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from conftest import tiny_pipeline, tiny_workload_dict

from jigsaw_verl.model.spec import SpecError, workload_from_dict
from jigsaw_verl.model.workload_file import bundled_workloads, load_workload


def test_bundled_workloads_load():
    names = [load_workload(f).name for f in bundled_workloads()]
    assert names == [
        "gsm8k-qwen3-4b-x2-8xh100",
        "hetero-mixed-16xa100",
        "longcot-async-qwen3-4b-x2-8xh100",
        "longcot-qwen3-4b-x2-8xh100",
        "paper-qwen3-4b-x2-4xh100",
    ]
    hetero = load_workload(bundled_workloads()[1])
    assert hetero.pipeline("mid-async").rollout_tp == 2 and hetero.pipeline("ppo-critic").critic


def test_measured_efficiencies_reach_the_cost_model():
    """``cluster.efficiency`` overrides the named cost-model constants for every cost model built for the pool; the
    others keep their defaults."""
    from jigsaw_verl.model.cost_model import CostModel, Efficiency

    d = tiny_workload_dict()
    d["cluster"]["efficiency"] = {"train_mfu": 0.2, "colocated_switch_s": 3}
    eff = CostModel.for_cluster(workload_from_dict(d).cluster).eff
    assert (eff.train_mfu, eff.colocated_switch_s) == (0.2, 3.0)
    assert eff.logprob_mfu == Efficiency().logprob_mfu
    assert CostModel.for_cluster(workload_from_dict(tiny_workload_dict()).cluster).eff == Efficiency()


def test_defaults_fill_optional_keys():
    d = tiny_workload_dict()
    for k in ("algorithm", "mode", "ref_model", "steps"):
        del d["pipelines"][0][k]
    p = workload_from_dict(d).pipelines[0]
    assert (p.algorithm, p.mode, p.ref_model, p.steps, p.arrival_s, p.rollout_tp) == ("grpo", "sync", True, 20, 0.0, 1)


def _bad(mutate) -> dict:
    d = tiny_workload_dict()
    mutate(d)
    return d


BAD = {
    "unknown key": (lambda d: d["pipelines"][0].update(temperature=1.0), "pipelines[0].temperature", "unknown key"),
    "unknown top key": (lambda d: d.update(gpus=8), "gpus", "unknown key"),
    "zero size": (lambda d: d["pipelines"][0].update(batch_prompts=0), "pipelines[0].batch_prompts", "must be >= 1"),
    "negative gpus": (lambda d: d["cluster"].update(num_gpus=-8), "cluster.num_gpus", "must be >= 1"),
    "negative median": (
        lambda d: d["pipelines"][1]["response_len"].update(median=-5),
        "pipelines[1].response_len.median",
        "> 0",
    ),
    "p99 below median": (
        lambda d: d["pipelines"][0]["response_len"].update(p99=100),
        "pipelines[0].response_len.p99",
        "below the median",
    ),
    "model too big": (lambda d: d["pipelines"][0].update(model="qwen3-32b"), "pipelines[0].model", "does not fit"),
    "kv too big": (
        lambda d: (
            d["pipelines"][0].update(
                model={"params_b": 60, "layers": 80, "hidden": 8192, "kv_heads": 64, "head_dim": 128},
                response_len={"median": 5000, "p99": 20000, "max": 60000},
                train_micro_batch_tokens=70000,
            )
            or d["cluster"].update(num_gpus=16, gpus_per_node=8)
        ),
        "pipelines[0].rollout_tp",
        "does not fit",
    ),
    "repeated name": (lambda d: d["pipelines"][1].update(name="a"), "pipelines[1].name", "repeated"),
    "unknown model": (lambda d: d["pipelines"][0].update(model="gpt-9"), "pipelines[0].model", "unknown model"),
    "unknown gpu": (lambda d: d["cluster"].update(gpu="V100"), "cluster.gpu", "unknown GPU"),
    "staleness on sync": (lambda d: d["pipelines"][0].update(max_staleness=2), "pipelines[0].max_staleness", "async"),
    "bad tp": (lambda d: d["pipelines"][0].update(rollout_tp=3), "pipelines[0].rollout_tp", "must divide"),
    "no pipelines": (lambda d: d.update(pipelines=[]), "pipelines", "non-empty"),
    "string size": (lambda d: d["pipelines"][0].update(steps="ten"), "pipelines[0].steps", "integer"),
    "missing model": (lambda d: d["pipelines"][0].pop("model"), "pipelines[0].model", "required"),
    "offload not a boolean": (
        lambda d: d["pipelines"][0].update(param_offload="yes"),
        "pipelines[0].param_offload",
        "expected true or false",
    ),
    "optimizer offload not a boolean": (
        lambda d: d["pipelines"][1].update(optimizer_offload=1),
        "pipelines[1].optimizer_offload",
        "expected true or false",
    ),
    "memory share zero": (
        lambda d: d["pipelines"][0].update(gpu_memory_utilization=0),
        "pipelines[0].gpu_memory_utilization",
        "must be > 0",
    ),
    "memory share above one": (
        lambda d: d["pipelines"][0].update(gpu_memory_utilization=1.5),
        "pipelines[0].gpu_memory_utilization",
        "must be in (0, 1]",
    ),
    "memory share too small": (
        lambda d: d["pipelines"][0].update(model="qwen3-4b", gpu_memory_utilization=0.05),
        "pipelines[0].gpu_memory_utilization",
        "at least 0.1 would",
    ),
    "unknown efficiency": (
        lambda d: d["cluster"].update(efficiency={"trian_mfu": 0.2}),
        "cluster.efficiency.trian_mfu",
        "unknown key (allowed: attention_hbm_efficiency",
    ),
    "mfu above one": (
        lambda d: d["cluster"].update(efficiency={"train_mfu": 1.5}),
        "cluster.efficiency.train_mfu",
        "must be in (0, 1]",
    ),
    "efficiency not a number": (
        lambda d: d["cluster"].update(efficiency={"logprob_mfu": "low"}),
        "cluster.efficiency.logprob_mfu",
        "expected a number",
    ),
    "negative overhead": (
        lambda d: d["cluster"].update(efficiency={"colocated_switch_s": -1}),
        "cluster.efficiency.colocated_switch_s",
        "must be >= 0",
    ),
    "recompute below one": (
        lambda d: d["cluster"].update(efficiency={"train_recompute_factor": 0.5}),
        "cluster.efficiency.train_recompute_factor",
        "must be >= 1",
    ),
    "log-prob micro-batch too small": (
        lambda d: d["pipelines"][0].update(logprob_micro_batch_tokens=1000),
        "pipelines[0].logprob_micro_batch_tokens",
        "cannot hold one sequence",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_names_key_and_problem(case):
    mutate, key, problem = BAD[case]
    with pytest.raises(SpecError) as err:
        workload_from_dict(_bad(mutate), "w.yaml")
    assert err.value.key == key
    assert problem in err.value.problem
    assert str(err.value).startswith(f"w.yaml: {key}: ")


def test_the_memory_share_a_refusal_names_is_enough():
    """The ``gpu_memory_utilization`` the refusal suggests loads; the cap it sets is what the engine gets."""
    with pytest.raises(SpecError, match=r"at least ([0-9.]+) would") as err:
        workload_from_dict(_bad(lambda d: d["pipelines"][0].update(model="qwen3-4b", gpu_memory_utilization=0.05)))
    enough = float(err.value.problem.rsplit("at least ", 1)[1].split()[0])
    w = workload_from_dict(_bad(lambda d: d["pipelines"][0].update(model="qwen3-4b", gpu_memory_utilization=enough)))
    assert w.pipelines[0].gpu_memory_utilization == enough


def test_too_many_pipelines():
    d = tiny_workload_dict(pipelines=[tiny_pipeline(f"p{i}") for i in range(65)])
    with pytest.raises(SpecError, match="at most 64"):
        workload_from_dict(d)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "jigsaw_verl.cli", *args], capture_output=True, text=True)


@pytest.mark.parametrize(
    "case", ["unknown key", "p99 below median", "model too big", "repeated name", "zero size", "memory share too small"]
)
def test_cli_bad_file_one_line_exit_2(tmp_path, case):
    mutate, key, _ = BAD[case]
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(_bad(mutate)))
    r = _cli("simulate", str(f), "--json", str(tmp_path / "out.json"))
    assert r.returncode == 2
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert str(f) in lines[0] and key in lines[0]
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "out.json").exists() or (tmp_path / "out.json").read_text() == ""


def test_cli_missing_file_and_bad_yaml(tmp_path):
    r = _cli("simulate", str(tmp_path / "nope.yaml"))
    assert r.returncode == 2 and "nope.yaml" in r.stderr and "cannot read" in r.stderr
    f = tmp_path / "broken.yaml"
    f.write_text("name: [unclosed\n")
    r = _cli("simulate", str(f))
    assert r.returncode == 2 and "not valid YAML" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_cli_unknown_policy(tmp_path):
    f = bundled_workloads()[0]
    r = _cli("simulate", str(f), "--policies", "verl,nosuch")
    assert r.returncode == 2 and "nosuch" in r.stderr and "verl-seq" in r.stderr and "jigsaw" in r.stderr
