"""Every baseline produces a valid, deterministic schedule."""

from __future__ import annotations

import pytest
from conftest import tiny_pipeline, tiny_workload_dict
from schedule_checks import check_all

from jigsaw_verl.model.spec import workload_from_dict
from jigsaw_verl.policy.catalog import BASELINES, POLICIES
from jigsaw_verl.sim.simulator import Simulator

WORKLOADS = {
    "two-sync": tiny_workload_dict(),
    "async-late-arrival": tiny_workload_dict(
        num_gpus=6,
        pipelines=[
            tiny_pipeline("s"),
            tiny_pipeline("x", mode="async", max_staleness=2, steps=4),
            tiny_pipeline("late", arrival_s=3.0, rollout_tp=2),
        ],
    ),
}


@pytest.mark.parametrize("policy", BASELINES)
@pytest.mark.parametrize("wname", sorted(WORKLOADS))
def test_every_configuration_is_valid(policy, wname):
    w = workload_from_dict(WORKLOADS[wname], wname)
    configs = POLICIES.get(policy)(w)
    assert configs or policy == "verl-split"
    for c in configs:
        check_all(w, Simulator(w, c).run())


def test_deterministic():
    w = workload_from_dict(WORKLOADS["async-late-arrival"])
    for policy in ("areal", "rollmux", "streamrl"):
        (c, *_) = POLICIES.get(policy)(w)
        a, b = Simulator(w, c).run(), Simulator(w, c).run()
        assert a.makespan_s == b.makespan_s and a.slices == b.slices and a.stages == b.stages


def test_verl_seq_runs_jobs_one_after_another(tiny_workload):
    (c,) = POLICIES.get("verl-seq")(tiny_workload)
    r = Simulator(tiny_workload, c).run()
    assert min(s.start_s for s in r.stages if s.pipeline == "b") >= r.finish_s["a"]
    assert all(len(s.gpus) == tiny_workload.cluster.num_gpus or s.stage == "rollout" for s in r.slices)


@pytest.mark.parametrize("policy", ["verl-split", "greedy"])
def test_finished_pipelines_release_device_memory(policy):
    """A finished job's state leaves the GPUs (it would otherwise shrink later replicas' KV caches)."""
    w = workload_from_dict(WORKLOADS["async-late-arrival"])
    sim = Simulator(w, POLICIES.get(policy)(w)[0])
    sim.run()
    assert not any(sim.resident)
