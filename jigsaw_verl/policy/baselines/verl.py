"""verl today: each job is a stock ``main_ppo`` run (hybrid engine, colocated, stage-synchronous).

Modelling assumptions:
- Rollout and training share the job's GPUs (verl's hybrid engine): per step, rollout on every GPU (replicas of
  ``rollout_tp``), then reward and old/ref log-prob, then the update, then the in-place weight reshard with the
  rollout engine's sleep/wake. Nothing of step k+1 starts before step k's weights are published.
- Pipelines marked ``async`` run synchronously too: the stock trainer has no staleness (verl's async recipes
  are the ``streamrl``/``areal`` forms below).
- With several jobs a verl user either queues them (``verl-seq``: one after another on the whole pool, in
  arrival order) or statically splits the pool (``verl-split``: equal contiguous slices, leftovers to the first
  jobs; infeasible when a slice cannot hold a job). ``verl`` is the faster of the two on each workload.
"""

from __future__ import annotations

from jigsaw_verl.model.spec import WorkloadSpec
from jigsaw_verl.policy.baselines.placement import Assignment, StaticPlacementPolicy, equal_slices, fits_colocated
from jigsaw_verl.policy.interface import ExecutionMode, Policy

COLOCATED_SYNC = ExecutionMode()


def verl_seq(workload: WorkloadSpec) -> list[Policy]:
    """``verl-seq``: one job after another, each on the whole pool."""
    everything = tuple(range(workload.cluster.num_gpus))
    assign = {p.name: Assignment(everything, everything) for p in workload.pipelines}
    modes = {p.name: COLOCATED_SYNC for p in workload.pipelines}
    return [StaticPlacementPolicy("verl-seq", "sequential, whole pool", assign, modes, sequential=True)]


def verl_split(workload: WorkloadSpec) -> list[Policy]:
    """``verl-split``: a static equal split of the pool, every job on its own slice from the start."""
    slices = equal_slices(workload)
    if slices is None or not all(fits_colocated(p, workload, len(s)) for p, s in zip(workload.pipelines, slices)):
        return []
    assign = {p.name: Assignment(s, s) for p, s in zip(workload.pipelines, slices)}
    modes = {p.name: COLOCATED_SYNC for p in workload.pipelines}
    config = "split " + "/".join(str(len(s)) for s in slices)
    return [StaticPlacementPolicy("verl-split", config, assign, modes, sequential=False)]


def verl(workload: WorkloadSpec) -> list[Policy]:
    """``verl``: the better of ``verl-seq`` and ``verl-split``."""
    return verl_seq(workload) + verl_split(workload)
