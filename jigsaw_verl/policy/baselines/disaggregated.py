"""Shared search of the disaggregated baselines (StreamRL, AReaL): per job, rollout GPUs apart from training GPUs.

A job's best rollout/training split is searched by simulating the job alone on its GPUs under every split the
memory allows, and kept if it finishes first. Jobs either get equal slices of the pool or run one after another
on the whole pool; both arrangements are candidates and the faster one is reported, so each peer gets its best
configuration on every workload.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from jigsaw_verl.model.spec import ClusterSpec, PipelineSpec, WorkloadSpec
from jigsaw_verl.policy.baselines.placement import Assignment, StaticPlacementPolicy, equal_slices, role_splits
from jigsaw_verl.policy.interface import ExecutionMode, Policy


def _alone_makespan(
    spec: PipelineSpec, workload: WorkloadSpec, split: Assignment, mode: ExecutionMode, name: str
) -> float:
    from jigsaw_verl.sim.simulator import (
        Simulator,  # the search simulates; imported here to keep module import order flat
    )

    gpus = split.rollout + split.train
    base = gpus[0]
    local = Assignment(tuple(g - base for g in split.rollout), tuple(g - base for g in split.train))
    cluster = ClusterSpec(
        gpu=workload.cluster.gpu, num_gpus=len(gpus), gpus_per_node=min(workload.cluster.gpus_per_node, len(gpus))
    )
    alone = replace(workload, cluster=cluster, pipelines=(replace(spec, arrival_s=0.0),))
    policy = StaticPlacementPolicy(name, "search", {spec.name: local}, {spec.name: mode}, sequential=True)
    return Simulator(alone, policy).run().makespan_s


def search_disaggregated(
    workload: WorkloadSpec, name: str, mode_of: Callable[[PipelineSpec], ExecutionMode]
) -> list[Policy]:
    """One candidate per arrangement (equal slices, one after another), each job on its best split."""
    everything = tuple(range(workload.cluster.num_gpus))
    modes = {p.name: mode_of(p) for p in workload.pipelines}
    arrangements = {"sequential": [everything] * len(workload.pipelines)}
    slices = equal_slices(workload)
    if slices is not None and len(workload.pipelines) > 1:
        arrangements["split"] = slices
    out: list[Policy] = []
    for arrangement, pools in arrangements.items():
        assign: dict[str, Assignment] = {}
        for p, pool in zip(workload.pipelines, pools):
            options = role_splits(p, workload, pool)
            if not options:
                break
            assign[p.name] = min(options, key=lambda a: _alone_makespan(p, workload, a, modes[p.name], name))
        else:
            parts = ", ".join(f"{p}: {len(a.rollout)}r+{len(a.train)}t" for p, a in assign.items())
            out.append(
                StaticPlacementPolicy(
                    name, f"{arrangement}; {parts}", assign, modes, sequential=arrangement == "sequential"
                )
            )
    return out
