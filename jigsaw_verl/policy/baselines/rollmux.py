"""RollMux-style: phase-level round-robin of jobs over one shared rollout pool and one shared training pool.

Modelling assumptions:
- The pool is split once into a rollout pool (first, a multiple of every job's TP size) and a training pool
  (large enough for every job's training state); the split is searched and the fastest reported.
- Jobs stay on-policy and synchronous. A rollout phase takes the whole rollout pool; a training phase (reward
  and log-prob passes, update, weight broadcast) the whole training pool. When a pool frees, the next job in
  round-robin order after the one that used it last gets it; a job that is mid-way through its training phase
  keeps the training pool until the phase ends.
- Switching jobs on a pool is warm: every job's state stays resident while memory allows; what must be
  evicted is reloaded from host memory at PCIe speed (RollMux's warm start).
"""

from __future__ import annotations

from jigsaw_verl.model.graph import LOGPROB, ROLLOUT
from jigsaw_verl.model.spec import WorkloadSpec
from jigsaw_verl.policy.baselines.placement import min_train, tp_unit
from jigsaw_verl.policy.interface import ExecutionMode, Policy, ReadyStage, SchedulerOutput, Snapshot, StartStage

ROLLMUX_MODE = ExecutionMode(staleness=0, colocated=False)


class RollMuxPolicy:
    """Round-robin of phases over a rollout pool and a training pool."""

    name = "rollmux"

    def __init__(self, workload: WorkloadSpec, rollout_gpus: int):
        n = workload.cluster.num_gpus
        self.rollout_pool = tuple(range(rollout_gpus))
        self.train_pool = tuple(range(rollout_gpus, n))
        self.order = [p.name for p in workload.pipelines]
        self.config = f"{rollout_gpus} rollout + {n - rollout_gpus} training GPUs"

    def mode(self, pipeline: str) -> ExecutionMode:
        return ROLLMUX_MODE

    def _next(self, candidates: list[ReadyStage], last: str | None) -> ReadyStage:
        start = self.order.index(last) + 1 if last in self.order else 0
        rank = {p: (i - start) % len(self.order) for i, p in enumerate(self.order)}
        return min(candidates, key=lambda r: rank[r.pipeline])

    def schedule(self, snapshot: Snapshot) -> SchedulerOutput:
        free = snapshot.free_gpus
        actions = []
        for pool, is_rollout in ((self.rollout_pool, True), (self.train_pool, False)):
            if not all(g in free for g in pool):
                continue
            ready = [r for r in snapshot.ready if (r.stage == ROLLOUT) == is_rollout]
            if not ready:
                continue
            last = snapshot.last_pipeline[pool[0]]
            # A training phase in progress (log-prob done, update or weight sync next) keeps the pool.
            mid_phase = [r for r in ready if r.pipeline == last and r.stage != LOGPROB and not is_rollout]
            pick = mid_phase[0] if mid_phase else self._next(ready, last)
            actions.append(StartStage(pick.pipeline, pick.step, pick.stage, pool))
        return SchedulerOutput(tuple(actions))


def rollmux(workload: WorkloadSpec) -> list[Policy]:
    unit, n = tp_unit(workload), workload.cluster.num_gpus
    need = max(min_train(p, workload) for p in workload.pipelines)
    return [RollMuxPolicy(workload, r) for r in range(unit, n - need + 1, unit)]
