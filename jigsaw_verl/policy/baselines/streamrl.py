"""StreamRL-style: disaggregated rollout and training, samples streamed to training, one-step asynchrony.

Modelling assumptions:
- Per job, rollout replicas and the trainer sit on separate GPUs; the split is searched (see
  :mod:`.disaggregated`), as is the choice between equal slices and one job after another.
- One-step off-policy: rollout of step k+1 starts once weights of step k-1 are published, overlapping training
  of step k. New weights travel by NCCL broadcast (NVLink inside a node, the NIC across) and are taken at the
  next rollout, never mid-generation.
- Streaming: reward and old/ref log-prob passes run micro-batch by micro-batch as samples finish; the update
  itself waits for the whole batch (advantage normalisation and mini-batch optimizer steps need it).
- StreamRL's output-length ranker is not modelled (it reorders, it does not shorten the tail).
"""

from __future__ import annotations

from jigsaw_verl.model.spec import WorkloadSpec
from jigsaw_verl.policy.baselines.disaggregated import search_disaggregated
from jigsaw_verl.policy.baselines.placement import SplitSearch
from jigsaw_verl.policy.interface import ExecutionMode, Policy

STREAMRL_MODE = ExecutionMode(staleness=1, stream_logprob=True, colocated=False)


def streamrl(workload: WorkloadSpec, *, split_search: SplitSearch | None = None) -> list[Policy]:
    return search_disaggregated(workload, "streamrl", lambda p: STREAMRL_MODE, split_search)
