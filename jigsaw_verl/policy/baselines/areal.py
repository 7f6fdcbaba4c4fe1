"""AReaL-style: fully asynchronous, interruptible rollouts under a staleness bound.

Modelling assumptions:
- Per job, rollout replicas and the trainer sit on separate GPUs; the split is searched (see
  :mod:`.disaggregated`), as is the choice between equal slices and one job after another.
- Rollout never drains: the requests of step k join the replicas while step k-1's tail is still generating
  (continuous batching), as soon as policy version k - ``max_staleness`` exists (the workload's bound; sync
  jobs get AReaL's default of 1).
- Each weight update interrupts the replicas: they load the weights (as long as the broadcast takes), then
  re-prefill every live sequence over prompt + tokens so far and continue.
- The trainer takes a step as soon as a whole batch of samples exists.
"""

from __future__ import annotations

from jigsaw_verl.model.spec import PipelineSpec, WorkloadSpec
from jigsaw_verl.policy.baselines.disaggregated import search_disaggregated
from jigsaw_verl.policy.baselines.placement import SplitSearch
from jigsaw_verl.policy.interface import ExecutionMode, Policy


def _areal_mode(spec: PipelineSpec) -> ExecutionMode:
    return ExecutionMode(staleness=spec.max_staleness, overlap_rollouts=True, interrupt_on_update=True, colocated=False)


def areal(workload: WorkloadSpec, *, split_search: SplitSearch | None = None) -> list[Policy]:
    return search_disaggregated(workload, "areal", _areal_mode, split_search)
