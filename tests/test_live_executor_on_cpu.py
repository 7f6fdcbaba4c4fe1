"""The live executor without Ray: pipelines walk their stages against a clock the test advances; the grants come
from the same core policies the simulator runs."""

from __future__ import annotations

import pytest

from jigsaw_verl.core.graph import STAGES, WEIGHT_SYNC
from jigsaw_verl.cpu.assets import build_tiny_assets
from jigsaw_verl.mux.executor import LiveExecutor, PoolTooSmall
from jigsaw_verl.mux.pipeline_spec import CPU_SLOT, pipeline_spec_from_verl

DURATION = {"rollout": 3.0, "logprob": 1.0, "update": 2.0, "weight_sync": 0.5}


def _spec(name: str, steps: int = 3):
    config = {
        "actor_rollout_ref": {"model": {"path": str(build_tiny_assets().model)}, "rollout": {"n": 4},
                              "actor": {"use_kl_loss": True}},
        "data": {"train_batch_size": 8, "max_prompt_length": 64, "max_response_length": 24},
        "trainer": {"total_training_steps": steps},
    }  # fmt: skip
    return pipeline_spec_from_verl(name, config)


def _run(ex: LiveExecutor, names: list[str], steps: int = 3, crash: str | None = None):
    """Each pipeline asks for its stages in verl's order; a stage takes DURATION; returns the finish times."""
    todo = {n: [(k, s) for k in range(steps) for s in STAGES] for n in names}
    running: dict[str, tuple[float, int, str]] = {}
    finished: dict[str, float] = {}
    now = 0.0

    def start(grants):
        for g in grants:
            assert g.pipeline not in running, "two stages of one pipeline at once"
            running[g.pipeline] = (now + DURATION[g.stage], g.step, g.stage)

    for n in names:
        start(ex.request(n, *todo[n].pop(0), now))
    while running:
        name, (end, step, stage) = min(running.items(), key=lambda kv: (kv[1][0], kv[0]))
        now = end
        del running[name]
        if name == crash and step == 1:
            start(ex.leave(name, now, "crashed"))
            continue
        start(ex.finish(name, step, stage, now))
        if todo[name]:
            start(ex.request(name, *todo[name].pop(0), now))
        else:
            finished[name] = now
            start(ex.leave(name, now))
    return finished


def _check_leases(ex: LiveExecutor):
    for slot in range(ex.num_slots):
        mine = [s for s in ex.slices if slot in s.gpus]
        for t in {s.start_s for s in mine}:
            assert sum(s.sm_share for s in mine if s.start_s <= t < s.end_s) <= 1.0 + 1e-9


@pytest.mark.parametrize("policy", ["jigsaw", "greedy"])
def test_two_pipelines_run_every_stage_in_order_without_oversubscribing(policy):
    ex = LiveExecutor(2, CPU_SLOT, policy=policy)
    for n in ("a", "b"):
        ex.join(_spec(n), 2, 0.0)
    finished = _run(ex, ["a", "b"])
    assert sorted(finished) == ["a", "b"]
    for n in ("a", "b"):
        ran = [(s.step, s.stage) for s in sorted(ex.slices, key=lambda s: s.start_s) if s.pipeline == n]
        assert ran == [(k, st) for k in range(3) for st in STAGES]
        # the policy decides every stage except verl's sync after the last step, which its graph does not have
        assert [(s.step, s.stage) for s in ex.slices if s.pipeline == n and s.forced] == [(2, WEIGHT_SYNC)]
    _check_leases(ex)
    assert not ex.policy_errors


def test_a_pipeline_too_big_for_the_pool_is_refused_alone():
    ex = LiveExecutor(2, CPU_SLOT)
    ex.join(_spec("a"), 2, 0.0)
    with pytest.raises(PoolTooSmall, match="pipeline 'big' needs 4 slots but the group's pool has 2"):
        ex.join(_spec("big"), 4, 0.0)
    assert sorted(ex.pipes) == ["a"]
    assert sorted(_run(ex, ["a"])) == ["a"]  # the other pipeline is unaffected


def test_a_crashed_pipeline_gives_its_leases_back_and_the_other_finishes():
    ex = LiveExecutor(2, CPU_SLOT)
    for n in ("a", "b"):
        ex.join(_spec(n), 2, 0.0)
    finished = _run(ex, ["a", "b"], crash="a")
    assert sorted(finished) == ["b"] and ex.left["a"] == "crashed"
    assert ex.free_slots() == [0, 1]
    _check_leases(ex)


def test_bad_requests_are_refused():
    ex = LiveExecutor(2, CPU_SLOT)
    ex.join(_spec("a"), 2, 0.0)
    with pytest.raises(KeyError, match="'zz' has not joined"):
        ex.request("zz", 0, "rollout", 0.0)
    with pytest.raises(ValueError, match="unknown stage 'train'"):
        ex.request("a", 0, "train", 0.0)
    with pytest.raises(ValueError, match="already joined"):
        ex.join(_spec("a"), 2, 0.0)
    with pytest.raises(ValueError, match="not granted"):
        ex.finish("a", 0, "update", 0.0)
    with pytest.raises(KeyError, match="nope"):
        LiveExecutor(2, CPU_SLOT, policy="nope")
