"""Typed settings of the ``jigsaw`` hydra group: defaults from the packaged YAML only, one-line errors for bad input,
and the pre-Ray refusal of a policy the live runtime cannot run (no Ray; one subprocess stops before it)."""

from __future__ import annotations

import dataclasses
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import DictConfig, OmegaConf

from jigsaw_verl.integration.cpu.assets import build_tiny_assets
from jigsaw_verl.integration.main_ppo import check_jigsaw_config, check_mux_policy
from jigsaw_verl.integration.pipeline_spec import mux_pipeline_name, mux_pool_slots, mux_slots
from jigsaw_verl.integration.rollout.tail_monitor import TailMonitor, TailPolicy
from jigsaw_verl.integration.settings import (
    CONFIG_FILE,
    KNOWN_KEYS,
    JigsawConfigError,
    JigsawSettings,
    MigrationSettings,
    MuxSettings,
)

ROOT = Path(__file__).resolve().parent.parent


def _run_config(**jigsaw) -> DictConfig:
    """The verl keys the pre-Ray checks read, plus a ``jigsaw`` group."""
    return OmegaConf.create(
        {
            "trainer": {
                "total_training_steps": 1, "nnodes": 1, "n_gpus_per_node": 2, "experiment_name": "exp",
                "use_v1": True, "v1": {"trainer_mode": "sync"},
            },
            "reward": {"reward_model": {"enable_resource_pool": False}},
            "data": {"train_batch_size": 8},
            "actor_rollout_ref": {
                "model": {"path": str(build_tiny_assets().model)}, "actor": {"strategy": "fsdp"},
                "rollout": {"name": "vllm"},
            },
            "jigsaw": jigsaw,
        }
    )  # fmt: skip


def test_defaults_come_from_the_packaged_yaml():
    group = OmegaConf.to_container(OmegaConf.load(CONFIG_FILE).jigsaw)
    assert set(group) == KNOWN_KEYS["jigsaw"]
    assert set(group["migration"]) == KNOWN_KEYS["jigsaw.migration"] and set(group["mux"]) == KNOWN_KEYS["jigsaw.mux"]
    settings = JigsawSettings.from_config(None)
    assert dataclasses.asdict(settings) == group
    assert JigsawSettings.from_config(OmegaConf.create({})) == settings  # a config without the group
    assert JigsawSettings.from_config(OmegaConf.create({"jigsaw": {"mux": {}}})) == settings
    # every key of the group keeps the comment that documents it
    lines = CONFIG_FILE.read_text().splitlines()
    body = lines[lines.index("jigsaw:") + 1 :]
    for i, line in enumerate(body):
        if line.strip() and not line.strip().startswith("#") and not line.rstrip().endswith(":"):
            assert body[i - 1].strip().startswith("#"), f"no comment above {line.strip()!r}"


def test_dataclasses_have_no_defaults_and_are_frozen_keyword_only():
    for cls in (JigsawSettings, MigrationSettings, MuxSettings):
        for f in dataclasses.fields(cls):
            assert f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING, (cls, f.name)
    migration = MigrationSettings(enable=True, tail_threshold=2, poll_s=0.5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        migration.poll_s = 1.0
    with pytest.raises(TypeError):
        MigrationSettings(True, 2, 0.5)  # keyword-only
    with pytest.raises(TypeError):
        MigrationSettings(enable=True)  # no defaults of their own
    # nor do the consumers repeat them
    assert inspect.signature(TailMonitor).parameters["poll_s"].default is inspect.Parameter.empty
    assert [f.name for f in dataclasses.fields(TailPolicy)] == ["tail_threshold"]
    assert dataclasses.fields(TailPolicy)[0].default is dataclasses.MISSING


def test_overrides_and_interpolations():
    config = OmegaConf.create(
        {
            "trainer": {"n_gpus_per_node": 3, "nnodes": 1, "experiment_name": "exp"},
            "jigsaw": {
                "enable": True,
                "migration": {"poll_s": 1, "tail_threshold": 2},
                "mux": {"group": "g", "policy": "greedy", "slots": "${trainer.n_gpus_per_node}", "offload": False},
            },
        }
    )
    s = JigsawSettings.from_config(config)
    assert s.enable and s.migration == MigrationSettings(enable=False, tail_threshold=2, poll_s=1.0)
    assert isinstance(s.migration.poll_s, float)
    assert (s.mux.group, s.mux.policy, s.mux.slots, s.mux.offload, s.mux.max_pipelines) == ("g", "greedy", 3, False, 4)
    # the derived values stay in pipeline_spec and read the typed settings
    assert mux_pipeline_name(s.mux, config) == "exp" and mux_slots(s.mux, config) == 3
    assert mux_pool_slots(s.mux, config) == 3
    named = dataclasses.replace(s.mux, pipeline="p0", slots=None, pool_slots=8)
    assert (mux_pipeline_name(named, config), mux_slots(named, config), mux_pool_slots(named, config)) == ("p0", 3, 8)


@pytest.mark.parametrize(
    "group, message",
    [
        ({"nope": 1}, "unknown key jigsaw.nope (known: enable, migration, mux)"),
        ({"migration": {"threshold": 3}}, "unknown key jigsaw.migration.threshold (known: enable, poll_s, tail_"),
        ({"mux": {"nope": 1}}, "unknown key jigsaw.mux.nope (known: gpu, group, max_pipelines, offload, pin_cores,"),
        ({"mux": 3}, "jigsaw.mux must be a group of keys (gpu, group, "),
        ({"enable": 1}, "jigsaw.enable must be true or false, got 1"),
        ({"migration": {"poll_s": "x"}}, "jigsaw.migration.poll_s must be a positive number of seconds, got 'x'"),
        ({"migration": {"poll_s": 0}}, "jigsaw.migration.poll_s must be a positive number of seconds, got 0"),
        ({"mux": {"sample_poll_s": -1}}, "jigsaw.mux.sample_poll_s must be a positive number of seconds, got -1"),
        ({"migration": {"tail_threshold": "x"}}, "jigsaw.migration.tail_threshold must be an integer >= 1"),
        ({"migration": {"tail_threshold": 0}}, "jigsaw.migration.tail_threshold must be >= 1, got 0"),
        ({"mux": {"group": 3}}, "jigsaw.mux.group must be a name (a string) or null, got 3"),
        ({"mux": {"slots": 0}}, "jigsaw.mux.slots must be a positive number of pool slots or null, got 0"),
        ({"mux": {"pool_slots": "two"}}, "jigsaw.mux.pool_slots must be a positive number of pool slots or null"),
        ({"mux": {"pool_nodes": 0}}, "jigsaw.mux.pool_nodes must be a positive number of nodes or null, got 0"),
        ({"mux": {"policy": None}}, "jigsaw.mux.policy must be a policy name (a string, e.g. jigsaw), got None"),
        ({"mux": {"max_pipelines": "x"}}, "jigsaw.mux.max_pipelines must be an integer >= 1 (pipelines), got 'x'"),
        ({"mux": {"max_pipelines": 0}}, "jigsaw.mux.max_pipelines=0: a group holds at least 1 pipeline"),
        ({"mux": {"offload": "yes"}}, "jigsaw.mux.offload must be true or false, got 'yes'"),
        ({"mux": {"gpu": 80}}, "jigsaw.mux.gpu must be a GPU type from the catalogue (e.g. H100-80G) or null"),
        ({"mux": {"slot_memory_mib": 0}}, "jigsaw.mux.slot_memory_mib must be a positive number of MiB or null"),
        ({"mux": {"slot_memory_mib": -5}}, "jigsaw.mux.slot_memory_mib must be a positive number of MiB or null"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_naming_the_key(group, message):
    with pytest.raises(JigsawConfigError) as err:
        JigsawSettings.from_config(OmegaConf.create({"jigsaw": group}))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_pre_ray_check_returns_the_settings():
    settings = check_jigsaw_config(_run_config(enable=True, mux={"group": "g", "pool_slots": 4}))
    assert settings.enable and settings.mux.group == "g" and settings.mux.pool_slots == 4
    with pytest.raises(JigsawConfigError, match="jigsaw.mux.slots: pipeline 'exp' needs 2 slots .* a pool of 1$"):
        check_jigsaw_config(_run_config(enable=True, mux={"group": "g", "pool_slots": 1}))
    # a disabled group is not checked against verl's keys
    assert not check_jigsaw_config(_run_config(mux={"policy": "areal"})).enable


def test_a_pipeline_whose_engines_never_sleep_cannot_join_a_group():
    config = _run_config(enable=True, mux={"group": "g", "pool_slots": 2})
    config.actor_rollout_ref.rollout.free_cache_engine = False
    with pytest.raises(JigsawConfigError, match=r"^actor_rollout_ref.rollout.free_cache_engine=false: a multiplexed"):
        check_jigsaw_config(config)
    config.actor_rollout_ref.rollout.free_cache_engine = True
    assert check_jigsaw_config(config).enable


def test_migration_runs_on_either_backend_in_trainer_mode_jigsaw():
    """Migration drives verl's replica objects, which vLLM's and SGLang's both have (SGLang's take whole
    migrations only: the migrator refuses a subset at run time); a trainer mode without the migrating hooks is
    refused."""
    for backend in ("vllm", "sglang"):
        config = _run_config(migration={"enable": True})
        config.actor_rollout_ref.rollout.name = backend
        assert check_jigsaw_config(config).migration.enable
    config.trainer.v1.trainer_mode = "separate_async"
    with pytest.raises(JigsawConfigError, match="^jigsaw.migration.enable=true runs trainer.v1.trainer_mode=jigsaw"):
        check_jigsaw_config(config)


def test_a_vllm_pipeline_in_a_group_turns_on_vllms_stat_logging_and_keeps_its_agent_loop_workers_nearby():
    """verl turns vLLM's stat logging off by default; the queue gauges the group's scheduler reads need it on. A
    pipeline of a group gets the agent-loop manager that keeps its workers on its trainer's node, unless it names
    its own."""
    from jigsaw_verl.integration.main_ppo import NODE_LOCAL_MANAGER, prepare

    saved = dict(os.environ)  # prepare() gives this process the run's environment variables too
    try:
        grouped = _run_config(enable=True, mux={"group": "g", "pool_slots": 2})
        grouped.actor_rollout_ref.rollout.disable_log_stats = True
        prepare(grouped)
        alone = _run_config()
        alone.actor_rollout_ref.rollout.disable_log_stats = True
        prepare(alone)
        own = _run_config(enable=True, mux={"group": "g", "pool_slots": 2})
        OmegaConf.update(own, "actor_rollout_ref.rollout.agent.agent_loop_manager_class", "my.Manager", force_add=True)
        prepare(own)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    assert grouped.actor_rollout_ref.rollout.disable_log_stats is False
    assert alone.actor_rollout_ref.rollout.disable_log_stats is True  # outside a group verl's setting stands
    assert grouped.actor_rollout_ref.rollout.agent.agent_loop_manager_class == NODE_LOCAL_MANAGER
    assert alone.actor_rollout_ref.rollout.get("agent", {}).get("agent_loop_manager_class") is None
    assert own.actor_rollout_ref.rollout.agent.agent_loop_manager_class == "my.Manager"


def test_asynchronous_policies_are_refused_before_ray():
    from jigsaw_verl.policy.registry import POLICIES, policies_needing_at_most

    runnable = policies_needing_at_most(frozenset())  # on-policy synchronous steps are all the live runtime runs
    assert "jigsaw" in runnable and "greedy" in runnable and "areal" not in runnable and "streamrl" not in runnable
    for name in runnable:
        check_mux_policy(name)
    with pytest.raises(JigsawConfigError) as err:
        check_jigsaw_config(_run_config(enable=True, mux={"group": "g", "policy": "areal"}))
    line = str(err.value)
    needs = ", ".join(sorted(POLICIES.get("areal").needs))
    assert line.startswith(f"jigsaw.mux.policy='areal' needs asynchronous execution ({needs}), ") and "\n" not in line
    assert line.endswith(f"it can run: {', '.join(runnable)}")
    with pytest.raises(JigsawConfigError, match=r"^jigsaw.mux.policy='streamrl' needs asynchronous execution"):
        check_mux_policy("streamrl")
    with pytest.raises(JigsawConfigError, match=r"^jigsaw.mux.policy='fastest' is unknown \(known: .*areal"):
        check_mux_policy("fastest")


def test_entry_point_refuses_areal_in_one_line_with_exit_2():
    args = ["jigsaw.enable=true", "jigsaw.mux.group=g", "trainer.total_training_steps=1", "jigsaw.mux.policy=areal"]
    r = subprocess.run(
        [sys.executable, "-m", "jigsaw_verl.main_ppo", *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-2000:]
    assert "jigsaw.mux.policy='areal' needs asynchronous execution" in lines[0] and "it can run: " in lines[0]
    assert "ray init" not in r.stdout
