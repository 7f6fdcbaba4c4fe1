"""How well the scheduler's predictor foresaw a run: its error per stage as the lengths drift.

For every step ``k >= 1`` of every pipeline, the predictor sees only the stages that had finished before step
``k``'s stage started (as the scheduler did) and predicts that stage's duration on the width it actually ran on;
the error is ``|predicted - actual| / actual``. Co-location and waiting inflate the actual durations the
predictor cannot see, so the error is an upper bound on the error of its duration model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jigsaw_verl.model.cost_model import CostModel
from jigsaw_verl.model.graph import LOGPROB, ROLLOUT, UPDATE
from jigsaw_verl.model.spec import WorkloadSpec
from jigsaw_verl.policy.interface import StageTiming
from jigsaw_verl.policy.jigsaw.predictor import Predictor
from jigsaw_verl.sim.simulator import SimResult


@dataclass(frozen=True)
class PredictorError:
    """Mean and max relative error of the predicted stage durations over steps >= 1.

    Attributes:
        mean: per stage, mean of ``|predicted - actual| / actual``.
        max: per stage, the largest such error.
        samples: per stage, how many stages were predicted.
    """

    mean: dict[str, float]
    max: dict[str, float]
    samples: dict[str, int]


def predictor_error(workload: WorkloadSpec, result: SimResult, cost: CostModel | None = None) -> PredictorError:
    cost = cost or CostModel.for_cluster(workload.cluster)
    pred = Predictor(workload.pipelines, cost, workload.cluster.num_gpus, workload.seed)
    offsets = result.rollout_finish_offsets
    history = [
        StageTiming(
            pipeline=s.pipeline,
            step=s.step,
            stage=s.stage,
            start_s=s.start_s,
            end_s=s.end_s,
            gpus=s.gpus,
            finish_offsets_s=offsets.get(s.pipeline, [()] * (s.step + 1))[s.step] if s.stage == ROLLOUT else (),
        )
        for s in sorted(result.stages, key=lambda s: s.end_s)
    ]
    errors: dict[str, list[float]] = {ROLLOUT: [], LOGPROB: [], UPDATE: []}
    for s in history:
        if s.step == 0 or s.stage not in errors or s.gpus <= 0:
            continue
        seen = tuple(h for h in history if h.end_s <= s.start_s)
        predicted = pred.stage_s(s.pipeline, seen, s.stage, s.gpus)
        actual = s.end_s - s.start_s
        if actual > 0:
            errors[s.stage].append(abs(predicted - actual) / actual)
    return PredictorError(
        mean={k: float(np.mean(v)) if v else 0.0 for k, v in errors.items()},
        max={k: float(np.max(v)) if v else 0.0 for k, v in errors.items()},
        samples={k: len(v) for k, v in errors.items()},
    )
