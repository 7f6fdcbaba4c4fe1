"""The slot memory rule: rollout engines' ``gpu_memory_utilization`` plus pinned state must fit a slot at once.

Pure functions and the live executor without Ray; the pre-Ray refusals of the entry point and the launcher are in
``test_recipe_entry_on_cpu.py``.
"""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf
from test_live_executor_on_cpu import _spec

from jigsaw_verl.integration.cpu.assets import build_tiny_assets
from jigsaw_verl.integration.pipeline_spec import engine_reservation_from_verl, mux_slot_spec, pipeline_spec_from_verl
from jigsaw_verl.integration.settings import JigsawSettings
from jigsaw_verl.model.catalogue import GPUS, GiB
from jigsaw_verl.model.engine_memory import EngineReservation, fitting_fraction, slot_memory_refusal
from jigsaw_verl.model.graph import ROLLOUT
from jigsaw_verl.model.memory import train_state_bytes
from jigsaw_verl.model.slots import CPU_REFERENCE_PARAMS, CPU_SLOT
from jigsaw_verl.model.topology import PoolTopology, pick_home
from jigsaw_verl.pool.homes import group_memory_refusal
from jigsaw_verl.runtime.executor import EngineMemoryRefused, LiveExecutor
from jigsaw_verl.runtime.live_policy import live_policy_factory

H100 = GPUS["H100-80G"].memory_bytes
KEY = "actor_rollout_ref.rollout.gpu_memory_utilization"


def _engine(name: str, fraction: float, pinned_gib: float = 0.0, slots: int = 1) -> EngineReservation:
    return EngineReservation(pipeline=name, slots=slots, fraction=fraction, pinned_bytes=pinned_gib * GiB)


def test_two_engines_at_verls_example_setting_are_refused_with_the_value_that_fits():
    """verl's examples reserve 0.6 of a GPU for vLLM; two such pipelines on one H100 cannot both start, and the
    line names the key and the largest value that fits beside the two pinned reference models (4 GiB each)."""
    pair = [_engine("a", 0.6, 4), _engine("b", 0.6, 4)]
    line = slot_memory_refusal(pair, H100, slot=3)
    assert line.startswith(f"{KEY}: slot 3 holds 'a' 0.6 + 0.05 pinned, 'b' 0.6 + 0.05 pinned")
    assert f"{KEY}=0.4 for each would fit" in line
    assert fitting_fraction(pair, H100) == 0.4
    assert slot_memory_refusal([_engine("a", 0.4, 4), _engine("b", 0.4, 4)], H100, 0) is None  # the advice holds
    assert slot_memory_refusal([_engine("a", 0.41, 4), _engine("b", 0.41, 4)], H100, 0) is not None
    assert slot_memory_refusal([_engine("a", 0.8, 4)], H100, 0) is None  # one pipeline alone: verl's own limit
    assert "no engine fits" in slot_memory_refusal([_engine("a", 0.1, 80)], H100, 0)


def test_the_group_rule_places_pipelines_as_the_executor_does():
    """Three one-slot pipelines on a two-slot pool: the third shares slot 0 with the first (the executor's home
    rule): at 0.46 each the first two fit, one a slot, and the third is refused on slot 0."""
    one, three = PoolTopology(2, 2), PoolTopology(3, 3)
    assert pick_home([], 1, 1, one) == (0,) and pick_home([(0,)], 1, 1, one) == (1,)
    assert pick_home([(0,), (1,)], 1, 1, one) == (0,)
    assert pick_home([(0, 1)], 2, 1, three) == (1, 2) and pick_home([(0,)], 2, 1, three) == (1, 2)
    two = [_engine("a", 0.46), _engine("b", 0.46)]
    assert group_memory_refusal(two, [1, 1], one, H100) is None
    line = group_memory_refusal([*two, _engine("c", 0.46)], [1, 1, 1], one, H100)
    assert line.startswith(f"{KEY}: slot 0 holds 'a' 0.46, 'c' 0.46") and f"{KEY}=0.45 for each would fit" in line
    refusal = group_memory_refusal([_engine("a", 0.45, slots=2), _engine("b", 0.5)], [1, 1], one, H100)
    assert refusal.startswith(f"{KEY}: slot 0")


def _verl_config(**rollout) -> dict:
    return {
        "actor_rollout_ref": {
            "model": {"path": str(build_tiny_assets().model)},
            "rollout": {"n": 4, "gpu_memory_utilization": 0.4, **rollout},
            "actor": {"use_kl_loss": True},
            "ref": {"fsdp_config": {"param_offload": False}},
        },
        "data": {"train_batch_size": 8, "max_prompt_length": 64, "max_response_length": 24},
        "trainer": {"total_training_steps": 3, "device": "cpu", "n_gpus_per_node": 2, "nnodes": 1},
    }


def test_a_verl_config_gives_its_engine_and_pinned_state_and_the_cpu_slot_is_the_gpu_scaled():
    """The reservation reads verl's keys: nothing is pinned with jigsaw.mux.offload (the reference model included:
    verl's FSDP engines offload a forward-only model to the CPU, whatever ``ref.fsdp_config.param_offload`` says);
    without it the training state is. On the CPU the slot is an H100 scaled by the model's size over 4B
    parameters."""
    config = OmegaConf.create(_verl_config())
    mux = JigsawSettings.from_config({}).mux
    spec = pipeline_spec_from_verl("a", config)
    engine = engine_reservation_from_verl(mux, config, spec)
    assert engine.fraction == 0.4 and engine.slots == 2 and engine.pinned_bytes == 0.0
    slot = mux_slot_spec(mux, config, spec)
    assert slot.memory_bytes == pytest.approx(H100 * spec.model.params / CPU_REFERENCE_PARAMS)
    resident = JigsawSettings.from_config({"jigsaw": {"mux": {"offload": False}}}).mux
    pinned = engine_reservation_from_verl(resident, config, spec).pinned_bytes
    assert pinned == pytest.approx(train_state_bytes(spec.model, critic=False, ref_model=False) / 2)
    sized = JigsawSettings.from_config({"jigsaw": {"mux": {"slot_memory_mib": 64}}}).mux
    assert mux_slot_spec(sized, config, spec).memory_bytes == 64 * 2**20


def _executor(slots: int) -> LiveExecutor:
    return LiveExecutor(slots, CPU_SLOT, live_policy_factory("greedy"), policy_name="greedy")


def test_a_pipeline_whose_engine_does_not_fit_beside_those_on_its_home_is_refused_at_join():
    ex = _executor(1)
    ex.join(_spec("a"), 1, 0.0, engine=_engine("a", 0.5))
    with pytest.raises(EngineMemoryRefused, match=rf"pipeline 'b' cannot join: {KEY}: slot 0 holds 'a' 0.5, 'b' 0.5"):
        ex.join(_spec("b"), 1, 0.0, engine=_engine("b", 0.5))
    assert list(ex.pipes) == ["a"]  # nothing of b is left in the group
    ex.join(_spec("b"), 1, 0.0, engine=_engine("b", 0.4))
    assert list(ex.pipes) == ["a", "b"]


def test_a_running_rollout_holds_its_engines_reservation_and_pinned_state_stays():
    """With the engine declared, the live snapshot's free memory is what the engine reserves while its rollout
    runs, plus what the pipeline pins, all the time."""
    ex = _executor(1)
    ex.join(_spec("a"), 1, 0.0, engine=_engine("a", 0.4, pinned_gib=1))
    usable = 0.9 * CPU_SLOT.memory_bytes
    assert ex.free_bytes()[0] == pytest.approx(usable - GiB)
    assert [g.stage for g in ex.request("a", 0, ROLLOUT, 0.0)] == [ROLLOUT]
    assert ex.free_bytes()[0] == pytest.approx(usable - GiB - 0.4 * CPU_SLOT.memory_bytes)
    ex.finish("a", 0, ROLLOUT, 1.0)
    assert ex.free_bytes()[0] == pytest.approx(usable - GiB)
