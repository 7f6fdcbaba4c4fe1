"""The device-memory ledger: charges fit or fail as CUDA's allocator does, the start-up check fails as vLLM's does,
the timeline and its check against the leases; a real CPU rollout server charging it in a pool (the whole
multiplexed run is checked against it in ``test_mux_on_cpu.py``)."""

from __future__ import annotations

import pytest

from jigsaw_verl.pool.ledger import (
    DeviceLedger,
    DeviceOutOfMemory,
    MiB,
    engines_awake_outside_leases,
    ledger_summary,
    memory_track,
)


def test_ledger_charges_fit_or_fail_naming_slot_pipeline_and_holder_and_nothing_changes_on_failure():
    ledger = DeviceLedger(2, 10 * MiB)
    ledger.charge(0, "a", "engine/r0", 4 * MiB)
    ledger.charge(0, "b", "actor/rank0", 5 * MiB)
    with pytest.raises(
        DeviceOutOfMemory,
        match=r"slot 0: pipeline 'b' tried to hold 2.000 MiB for engine/r0; the "
        r"slot holds 9.000 MiB of 10.000 MiB \(a/engine/r0 4.000 MiB, b/actor/rank0 5.000 MiB\)",
    ):
        ledger.charge(0, "b", "engine/r0", 2 * MiB)
    assert ledger.slot_bytes(0) == 9 * MiB and ledger.slot_bytes(1) == 0
    ledger.charge(0, "b", "actor/rank0", 6 * MiB)  # a holder's new size replaces its old one
    ledger.release(0, "a", "engine/r0")
    ledger.charge(0, "b", "engine/r0", 2 * MiB)
    assert ledger.slot_bytes(0) == 8 * MiB
    ledger.release_pipeline("b")
    assert ledger.slot_bytes(0) == 0
    timeline = ledger.timeline()
    assert [e["slot_bytes"] / MiB for e in timeline["events"]] == [4, 9, 10, 6, 8, 2, 0]
    assert timeline["peak_bytes"] == [10 * MiB, 0.0] and timeline["capacity_bytes"] == 10 * MiB
    track = memory_track(timeline)
    assert len(track) == 7 and track[2]["args"]["MiB"] == 10 and track[0]["ph"] == "C"
    summary = ledger_summary(timeline, leases=[])  # no lease at all: a's and b's engines were awake outside one
    assert summary.startswith("device-memory ledger: peak per slot 10.000, 0.000 MiB of 10.000 MiB; rollout engines")
    assert "slot 0: a/engine/r0 held memory" in summary and "slot 0: b/engine/r0 held memory" in summary
    rollouts = [{"pipeline": p, "stage": "rollout", "gpus": [0], "start_s": 0.0, "end_s": 1e9} for p in "ab"]
    assert ledger_summary(timeline, rollouts).endswith("awake outside their leases: none")


def test_ledger_startup_check_fails_as_vllms_and_bad_input_is_refused():
    ledger = DeviceLedger(1, 10 * MiB)
    ledger.charge(0, "a", "engine/r0", 6 * MiB)
    ledger.check_free(0, "b", "engine/r0", 4 * MiB)
    with pytest.raises(
        DeviceOutOfMemory,
        match=r"slot 0: free memory on startup \(4.000 MiB\) is less than what "
        r"engine/r0 of pipeline 'b' reserves \(5.000 MiB",
    ):
        ledger.check_free(0, "b", "engine/r0", 5 * MiB)
    with pytest.raises(ValueError, match="slot 3 is not in the pool's 1 slots"):
        ledger.charge(3, "a", "x", 1)
    with pytest.raises(ValueError, match="jigsaw.mux.slot_memory_mib: a slot's memory must be positive"):
        DeviceLedger(1, 0)


def test_engines_awake_outside_leases_finds_each_uncovered_stretch():
    """The check the mux run's ``memory.json`` is held to: an engine's memory counts only inside its pipeline's
    rollout, weight-sync, init and validation leases on that slot; other holders (training state) are not its
    business."""
    events = [  # (t, slot, pipeline, holder, MiB held after the change)
        (1.0, 0, "a", "engine/r0", 4), (2.0, 0, "a", "engine/r0", 0),  # inside a's rollout lease 0.5-2.5
        (3.0, 0, "a", "engine/r0", 4), (6.0, 0, "a", "engine/r0", 0),  # 3-6: the sync lease 3-4 covers 1 s of it
        (3.0, 1, "b", "engine/r1", 4),  # never released: awake to the timeline's end (6 s), no lease there
        (3.0, 1, "b", "actor/rank1/params", 1),  # training state: not checked here
    ]  # fmt: skip
    fields = ("t_s", "slot", "pipeline", "holder", "held_bytes")
    timeline = {"events": [dict(zip(fields, (*e[:4], e[4] * MiB), strict=True), slot_bytes=0.0) for e in events]}
    leases = [
        {"pipeline": "a", "stage": "rollout", "gpus": [0], "start_s": 0.5, "end_s": 2.5},
        {"pipeline": "a", "stage": "weight_sync", "gpus": [0], "start_s": 3.0, "end_s": 4.0},
        {"pipeline": "a", "stage": "update", "gpus": [0], "start_s": 4.0, "end_s": 6.0},
        {"pipeline": "b", "stage": "rollout", "gpus": [0], "start_s": 3.0, "end_s": 6.0},  # another slot's lease
    ]
    found = engines_awake_outside_leases(timeline, leases)
    assert found == [
        "slot 0: a/engine/r0 held memory 3.00-6.00 s, 2.00 s of it outside its engine leases",
        "slot 1: b/engine/r1 held memory 3.00-6.00 s, 3.00 s of it outside its engine leases",
    ]
    assert engines_awake_outside_leases(timeline, leases, slack_s=2.0) == [found[1]]


def _server_config(fraction: float):
    from types import SimpleNamespace

    return SimpleNamespace(max_num_seqs=8, prompt_length=32, response_length=8, max_model_len=40, seed=0,
                           full_determinism=False, gpu_memory_utilization=fraction)  # fmt: skip


def test_ledger_a_rollout_server_starts_as_vllm_does_and_charges_what_it_holds(ray_session):
    """A real CPU rollout server in a pool with a ledger: its start fails as vLLM's start-up check does when the
    slot's free memory is below ``gpu_memory_utilization`` x memory (nothing of it is then charged); started, it
    holds that much; ``sleep`` frees it all, waking the weights charges the weights, the KV cache the rest."""
    from types import SimpleNamespace

    from jigsaw_verl.integration.cpu.assets import build_tiny_assets
    from jigsaw_verl.integration.cpu.rollout.server import CPURolloutServer
    from jigsaw_verl.integration.cpu.slot_memory import SlotMemory
    from jigsaw_verl.runtime.ledger_actor import create_ledger

    ray = ray_session
    capacity = 4 * MiB  # the tiny model's float32 weights are ~1 MiB
    ledger = create_ledger("ledger-test", 1, capacity, t0=0.0)
    job = ray.get_runtime_context().get_job_id()
    try:
        ray.get(ledger.register.remote(job, "a", [0]))
        ray.get(ledger.register.remote("other-job", "b", [0]))
        ray.get(ledger.charge.remote("other-job", 0, "actor/rank0/params", 2.5 * MiB))
        memory = SlotMemory("ledger-test", (0,), job)
        model = SimpleNamespace(local_path=str(build_tiny_assets().model))
        remote = ray.remote(CPURolloutServer).options(num_cpus=0)
        refused = remote.remote(config=_server_config(0.5), model_config=model, replica_rank=0, memory=memory)
        with pytest.raises(ray.exceptions.RayActorError, match=r"slot 0: free memory on startup \(1.500 MiB\) is "
                           r"less than what engine/r0 of pipeline 'a' reserves \(2.000 MiB"):  # fmt: skip
            ray.get(refused.telemetry.remote())
        assert ray.get(ledger.slot_bytes.remote()) == [2.5 * MiB]
        ray.get(ledger.release.remote("other-job", 0, "actor/rank0/params"))
        server = remote.remote(config=_server_config(0.5), model_config=model, replica_rank=0, memory=memory)
        ray.get(server.telemetry.remote())  # started (its constructor charged the ledger)
        assert ray.get(ledger.slot_bytes.remote()) == [2 * MiB]
        ray.get(server.sleep.remote())
        assert ray.get(ledger.slot_bytes.remote()) == [0.0]
        ray.get(server.wake_up.remote(tags=["weights"]))
        weights = ray.get(ledger.slot_bytes.remote())[0]
        assert 0.5 * MiB < weights < 2 * MiB
        ray.get(server.wake_up.remote(tags=["kv_cache"]))
        assert ray.get(ledger.slot_bytes.remote()) == [2 * MiB]
        # another pipeline's charge now fails as CUDA's allocator would, naming slot, pipeline and holder
        with pytest.raises(ray.exceptions.RayTaskError, match="pipeline 'b' tried to hold 2.500 MiB for actor"):
            ray.get(ledger.charge.remote("other-job", 0, "actor/rank0/params", 2.5 * MiB))
        ray.kill(server)
    finally:
        ray.kill(ledger)


def test_ledger_two_pipelines_asking_for_the_pool_at_once_get_one_placement_group_and_one_ledger(ray_session):
    """Pipelines ask the group's scheduler (an async actor) for the pool concurrently: the second call comes while
    the first awaits its placement group's placement, and must wait for that pool, not make a second one with the
    same name (which Ray refuses: a run's second pipeline died with "name 'jigsaw-pool-mux' already exists")."""
    from test_live_executor_on_cpu import _spec

    from jigsaw_verl.model.slots import CPU_SLOT
    from jigsaw_verl.runtime.ledger_actor import find_ledger
    from jigsaw_verl.runtime.scheduler import CPU_RESOURCE, get_scheduler

    ray = ray_session
    scheduler = get_scheduler("pool-race", num_slots=2, gpu=CPU_SLOT, policy="jigsaw", max_pipelines=2)
    placements = []
    try:
        for name in ("a", "b"):
            ray.get(scheduler.join.remote(_spec(name), 1))
        placements = ray.get([scheduler.pool.remote(CPU_RESOURCE, name) for name in ("a", "b")])
        assert placements[0].placement_groups == placements[1].placement_groups
        assert len(placements[0].placement_groups) == 1  # one node
        assert sorted(p.first_slot for p in placements) == [0, 1]
        assert find_ledger("pool-race") is not None
    finally:
        ledger = find_ledger("pool-race")
        for actor in (scheduler, ledger):
            if actor is not None:
                ray.kill(actor)
        for pg in placements[0].placement_groups if placements else ():
            ray.util.remove_placement_group(pg)
