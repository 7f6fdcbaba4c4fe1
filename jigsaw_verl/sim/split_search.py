"""The simulator's split search for the disaggregated baselines (StreamRL, AReaL).

A rollout/training split is judged by simulating the job alone on its GPUs, from time 0, one job on a pool of just
those GPUs: the split whose run finishes first wins (ties to the first in option order). Two searches do that:

- :func:`fastest_split_alone` tries every split the memory allows (``len(options)`` runs). It is the reference.
- :func:`fastest_split_pruned` is the one the runner hands every policy it builds. Up to ``EXHAUSTIVE_UP_TO``
  options it is the exhaustive search; beyond, it runs a coarse grid of ``COARSE_POINTS`` splits across the
  options, then a pattern search around the best point with a halving stride (the best of the point and its two
  neighbours at the stride, stride halved until 1): about ``COARSE_POINTS + 2 log2(n / COARSE_POINTS)`` runs
  instead of ``n``. When the makespan is unimodal in the rollout GPU count (rollout gets faster, training slower,
  as GPUs move from one to the other) it finds the exhaustive search's split; where it is not, the split it
  keeps is still a simulated one, never an estimate. ``scripts/split_search_check.py`` prints both searches'
  makespans side by side.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from jigsaw_verl.model.spec import ClusterSpec, PipelineSpec, WorkloadSpec
from jigsaw_verl.policy.baselines.placement import Assignment, StaticPlacementPolicy
from jigsaw_verl.policy.interface import ExecutionMode
from jigsaw_verl.sim.simulator import Simulator

# Options searched exhaustively (a bundled 8-GPU workload has at most 7); the pruned search's first grid size.
EXHAUSTIVE_UP_TO = 8
COARSE_POINTS = 6


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
    """The split among ``options`` on which ``spec`` alone finishes first, every option simulated (a
    ``SplitSearch``)."""
    return min(options, key=lambda split: alone_makespan_s(spec, workload, split, mode, name))


def pruned_argmin(n: int, cost: Callable[[int], float]) -> int:
    """An index in ``range(n)`` of small ``cost``: all of them up to ``EXHAUSTIVE_UP_TO``, else a coarse grid then
    a halving pattern search; the exact minimiser of a unimodal ``cost``. Each index is costed at most once; ties
    go to the lower index."""
    seen: dict[int, float] = {}

    def key(i: int) -> tuple[float, int]:
        if i not in seen:
            seen[i] = cost(i)
        return seen[i], i

    if n <= EXHAUSTIVE_UP_TO:
        return min(range(n), key=key)
    grid = sorted({round(k * (n - 1) / (COARSE_POINTS - 1)) for k in range(COARSE_POINTS)})
    best = min(grid, key=key)
    stride = max(b - a for a, b in zip(grid, grid[1:])) // 2
    while stride >= 1:
        best = min((i for i in (best - stride, best, best + stride) if 0 <= i < n), key=key)
        stride //= 2
    # A unimodal cost's minimiser is now one of best's neighbours at most: settle it.
    while True:
        step = min((i for i in (best - 1, best, best + 1) if 0 <= i < n), key=key)
        if step == best:
            return best
        best = step


def fastest_split_pruned(
    spec: PipelineSpec, workload: WorkloadSpec, options: list[Assignment], mode: ExecutionMode, name: str
) -> Assignment:
    """The split among ``options`` (ordered by rollout GPUs) that :func:`pruned_argmin` finds fastest for ``spec``
    alone (a ``SplitSearch``; the runner's)."""
    return options[pruned_argmin(len(options), lambda i: alone_makespan_s(spec, workload, options[i], mode, name))]
