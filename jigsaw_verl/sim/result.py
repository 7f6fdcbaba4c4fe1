"""The result record of one simulated run."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from jigsaw_verl.pool.timeline import MigrationRecord, Slice, StageRecord, Timeline


@dataclass(frozen=True)
class SimResult:
    """Everything a run produced. Metrics are derived from it in :mod:`jigsaw_verl.sim.runner`.

    Attributes:
        workload: workload name.
        policy: policy name.
        config: the configuration the policy fixed (split, order).
        num_gpus: pool size.
        makespan_s: when the last pipeline finished.
        finish_s: per pipeline, when its last update finished.
        slices: every sub-stage that ran.
        stages: every stage's start and end.
        generated: per pipeline, per step, tokens generated for each response (index order).
        completions: per pipeline, per step, how many times each response finished.
        reprefill_tokens: tokens re-prefilled after interrupts or migrations.
        staleness: per pipeline, the staleness the policy ran it with.
        migrations: every migration executed.
        rollout_finish_offsets: per pipeline, per step, when each response finished after the rollout began
            (the live-batch curve the predictor learns from), seconds.
    """

    workload: str
    policy: str
    config: str
    num_gpus: int
    makespan_s: float
    finish_s: dict[str, float]
    slices: tuple[Slice, ...]
    stages: tuple[StageRecord, ...]
    generated: dict[str, list[np.ndarray]]
    completions: dict[str, list[np.ndarray]]
    reprefill_tokens: int
    staleness: dict[str, int]
    migrations: tuple[MigrationRecord, ...] = ()
    rollout_finish_offsets: dict[str, list[tuple[float, ...]]] = field(default_factory=dict)

    def timeline(self) -> Timeline:
        """The run as the report writers read it."""
        return Timeline(label=self.config, num_slots=self.num_gpus, end_s=self.makespan_s, slices=self.slices)
