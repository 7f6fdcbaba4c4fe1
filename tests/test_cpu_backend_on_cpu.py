"""CPU backend wiring: bad configurations fail before Ray starts; the patches do what their docstrings say."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from jigsaw_verl.integration.cpu.assets import build_tiny_assets

ROOT = Path(__file__).resolve().parent.parent


def _main_ppo(*overrides: str) -> tuple[subprocess.CompletedProcess, float]:
    started = time.perf_counter()
    r = subprocess.run(
        [sys.executable, "-m", "jigsaw_verl.main_ppo", *overrides], capture_output=True, text=True, cwd=ROOT,
        timeout=120,
    )  # fmt: skip
    return r, time.perf_counter() - started


def test_cpu_device_with_gpu_rollout_names_both_keys():
    assets = build_tiny_assets()
    r, _ = _main_ppo("trainer.device=cpu", "actor_rollout_ref.rollout.name=vllm",
                     f"actor_rollout_ref.model.path={assets.model}")  # fmt: skip
    assert r.returncode == 2
    assert "trainer.device=cpu" in r.stderr and "actor_rollout_ref.rollout.name" in r.stderr and "'vllm'" in r.stderr
    assert "Traceback" not in r.stderr and "ray init" not in r.stdout + r.stderr


def test_missing_model_path_fails_before_ray():
    r, _ = _main_ppo("trainer.device=cpu", "actor_rollout_ref.rollout.name=cpu",
                     "actor_rollout_ref.model.path=/nonexistent/model")  # fmt: skip
    assert r.returncode == 2
    assert "actor_rollout_ref.model.path" in r.stderr and "/nonexistent/model" in r.stderr
    assert "ray init" not in r.stdout + r.stderr


def test_unknown_jigsaw_key_fails_before_ray():
    r, _ = _main_ppo("+jigsaw.mux_group=x", "trainer.device=cpu", "actor_rollout_ref.rollout.name=cpu")
    assert r.returncode == 2 and "jigsaw.mux_group" in r.stderr and "ray init" not in r.stdout + r.stderr


def test_migration_keys_are_checked_before_ray():
    r, _ = _main_ppo("jigsaw.migration.enable=true", "+jigsaw.migration.threshold=3", "trainer.device=cpu")
    assert r.returncode == 2 and "jigsaw.migration.threshold" in r.stderr
    r, _ = _main_ppo("jigsaw.migration.enable=true", "trainer.v1.trainer_mode=separate_async", "trainer.device=cpu")
    assert r.returncode == 2 and "trainer.v1.trainer_mode" in r.stderr and "ray init" not in r.stdout + r.stderr


PATCH_PROBE = textwrap.dedent(
    """
    import os, json
    os.environ["VERL_PLATFORM"] = "cpu"
    import verl  # loads the jigsaw_cpu plugin, which applies the jigsaw_verl.patches
    import jigsaw_verl.patches
    from verl.utils.device import get_device_name, get_torch_device
    from verl.workers.rollout.base import get_rollout_class
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp import transformer_impl
    from verl.single_controller.ray.base import ResourcePoolManager
    import verl.utils.distributed as dist_utils
    import torch.distributed as dist
    out = {"device": get_device_name(), "applied_again": jigsaw_verl.patches.apply_all()}
    out["rollout_cls"] = get_rollout_class("cpu", "async").__name__
    out["engine"] = EngineRegistry.get_engine_cls("language_model", "fsdp2").__name__
    out["pin"] = transformer_impl.CPUOffloadPolicy().pin_memory
    out["mem"] = get_torch_device().memory_allocated() > 0
    os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="29533")
    dist_utils.initialize_global_process_group_ray()
    out["backend"] = dist.get_backend()
    dist.destroy_process_group()
    mgr = ResourcePoolManager(resource_pool_spec={"p": [10**6]}, mapping={})
    import ray
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        mgr._check_resource_available()
    except ValueError as err:
        out["pool_error"] = str(err)
    ray.shutdown()
    print("RESULT" + json.dumps(out))
    """
)


def test_patches_and_registrations_in_a_cpu_process():
    r = subprocess.run([sys.executable, "-c", PATCH_PROBE], capture_output=True, text=True, cwd=ROOT, timeout=180)
    assert r.returncode == 0, r.stderr[-3000:]
    import json

    out = json.loads(r.stdout.split("RESULT", 1)[1])
    assert out["device"] == "cpu"
    assert out["applied_again"] == []  # idempotent: the plugin applied them already
    assert out["rollout_cls"] == "CPUServerAdapter"
    assert out["engine"] == "FSDPEngineWithLMHead"
    assert out["pin"] is False
    assert out["mem"] is True
    assert out["backend"] == "gloo"
    assert "Total available CPUs 2" in out["pool_error"]  # counted CPU slots, not GPUs


def test_patches_refuse_another_verl_version(monkeypatch):
    import jigsaw_verl.patches

    monkeypatch.setattr(jigsaw_verl.patches, "installed_verl_version", lambda: "0.10.0")
    with pytest.raises(jigsaw_verl.patches.VerlVersionError, match="written for verl 0.9.1"):
        jigsaw_verl.patches.apply_all()


def test_plugin_does_nothing_outside_cpu_runs():
    code = (
        "import sys, verl; from verl.workers.rollout.base import _ROLLOUT_REGISTRY; "
        "print(('cpu', 'async') in _ROLLOUT_REGISTRY, 'verl.workers.engine.fsdp.transformer_impl' in sys.modules)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                       env={k: v for k, v in __import__("os").environ.items() if k != "VERL_PLATFORM"})  # fmt: skip
    assert r.stdout.strip().splitlines()[-1] == "False False"
