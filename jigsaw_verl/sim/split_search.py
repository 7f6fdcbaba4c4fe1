"""The simulator's split search for the disaggregated baselines (StreamRL, AReaL).

Each rollout/training split the memory allows is tried by simulating the job alone on its GPUs, from time 0, one
job on a pool of just those GPUs; the split whose run finishes first is kept (ties to the first tried). It is the
:class:`~jigsaw_verl.policy.baselines.placement.SplitSearch` the runner hands every policy it builds.
"""

from __future__ import annotations

from dataclasses import replace

from jigsaw_verl.model.spec import ClusterSpec, PipelineSpec, WorkloadSpec
from jigsaw_verl.policy.baselines.placement import Assignment, StaticPlacementPolicy
from jigsaw_verl.policy.interface import ExecutionMode
from jigsaw_verl.sim.simulator import Simulator


def alone_makespan_s(
    spec: PipelineSpec, workload: WorkloadSpec, split: Assignment, mode: ExecutionMode, name: str
) -> float:
    """Seconds ``spec`` takes alone on the GPUs of ``split`` (renumbered from 0, nodes no larger than the pool)."""
    gpus = split.rollout + split.train
    base = gpus[0]
    local = Assignment(tuple(g - base for g in split.rollout), tuple(g - base for g in split.train))
    cluster = ClusterSpec(
        gpu=workload.cluster.gpu, num_gpus=len(gpus), gpus_per_node=min(workload.cluster.gpus_per_node, len(gpus))
    )
    alone = replace(workload, cluster=cluster, pipelines=(replace(spec, arrival_s=0.0),))
    policy = StaticPlacementPolicy(name, "search", {spec.name: local}, {spec.name: mode}, sequential=True)
    return Simulator(alone, policy).run().makespan_s


def fastest_split_alone(
    spec: PipelineSpec, workload: WorkloadSpec, options: list[Assignment], mode: ExecutionMode, name: str
) -> Assignment:
    """The split among ``options`` on which ``spec`` alone finishes first (a ``SplitSearch``)."""
    return min(options, key=lambda split: alone_makespan_s(spec, workload, split, mode, name))
