"""Shared helpers: small workloads built in code (the bundled files are tested as files)."""

from __future__ import annotations

import copy
import os

import pytest

from jigsaw_verl.model.spec import workload_from_dict

# Ray's raylet starts every worker at niceness 15 (RayConfig worker_niceness). Beside any nice-0 load on the machine
# (a parallel build, the busy loops of a loaded test run) the pipelines' workers then get about 3% of a core each and a
# 2-minute verl run takes over 15 minutes; the drivers and the launcher, not Ray workers, stay at niceness 0. The
# tests run Ray's workers at the priority of the rest of the test, here and in every subprocess they start.
os.environ.setdefault("RAY_worker_niceness", "0")

TINY_MODEL = {"params_b": 0.5, "layers": 8, "hidden": 1024, "kv_heads": 4, "head_dim": 128}


def tiny_pipeline(name: str, **over) -> dict:
    p = {
        "name": name,
        "model": TINY_MODEL,
        "algorithm": "grpo",
        "mode": "sync",
        "batch_prompts": 4,
        "group_size": 2,
        "prompt_len": {"median": 60, "p99": 200, "max": 256},
        "response_len": {"median": 150, "p99": 900, "max": 1024, "group_corr": 0.5, "drift": 0.02},
        "ref_model": True,
        "train_micro_batch_tokens": 2048,
        "steps": 3,
    }
    p.update(over)
    return p


def tiny_workload_dict(num_gpus: int = 4, pipelines: list[dict] | None = None, **over) -> dict:
    d = {
        "name": "tiny",
        "seed": 0,
        "cluster": {"gpu": "H100-80G", "num_gpus": num_gpus, "gpus_per_node": min(8, num_gpus)},
        "pipelines": pipelines or [tiny_pipeline("a"), tiny_pipeline("b", algorithm="ppo", group_size=1)],
    }
    d.update(over)
    return copy.deepcopy(d)


@pytest.fixture
def tiny_workload():
    return workload_from_dict(tiny_workload_dict(), "tiny.yaml")


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray session shared by every test that needs actors (a start costs seconds)."""
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def alone_runs(tmp_path_factory):
    """The tiny pipelines (:mod:`tiny_pipelines`) each run alone once per session: the reference every live
    multiplexing test compares its pipelines' responses, rewards and losses with."""
    from tiny_pipelines import run_alone

    return run_alone(tmp_path_factory.mktemp("alone"))
