"""Shared search of the disaggregated baselines (StreamRL, AReaL): per job, rollout GPUs apart from training GPUs.

A job's rollout/training split is chosen among every split the memory allows by a :class:`SplitSearch` the
executor supplies (the simulator's runs the job alone on each and keeps the one that finishes first). Jobs either
get equal slices of the pool or run one after another on the whole pool; both arrangements are candidates and the
faster one is reported, so each peer gets its best configuration on every workload.
"""

from __future__ import annotations

from collections.abc import Callable

from jigsaw_verl.model.spec import PipelineSpec, WorkloadSpec
from jigsaw_verl.policy.baselines.placement import (
    Assignment,
    SplitSearch,
    StaticPlacementPolicy,
    equal_slices,
    role_splits,
)
from jigsaw_verl.policy.interface import ExecutionMode, Policy


def search_disaggregated(
    workload: WorkloadSpec,
    name: str,
    mode_of: Callable[[PipelineSpec], ExecutionMode],
    split_search: SplitSearch | None,
) -> list[Policy]:
    """One candidate per arrangement (equal slices, one after another), each job on the split ``split_search``
    picks; raises ``ValueError`` without one."""
    if split_search is None:
        raise ValueError(
            f"policy {name!r} picks its rollout/training split by simulation: run it through jigsaw-verl simulate "
            "(sim.runner), which supplies the split search"
        )
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
            assign[p.name] = split_search(p, workload, options, modes[p.name], name)
        else:
            parts = ", ".join(f"{p}: {len(a.rollout)}r+{len(a.train)}t" for p, a in assign.items())
            out.append(
                StaticPlacementPolicy(
                    name, f"{arrangement}; {parts}", assign, modes, sequential=arrangement == "sequential"
                )
            )
    return out
