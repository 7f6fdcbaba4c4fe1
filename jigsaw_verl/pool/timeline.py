"""The one timeline record of a run, simulated or live: slices, stage records, migrations.

Both executors record what ran as :class:`Slice` s (the simulator one per sub-stage, the live executor one per
lease segment), so tables, traces and plots (:mod:`jigsaw_verl.report`) read simulated and live runs alike.
"""

from __future__ import annotations

from dataclasses import dataclass

# sub-stage names of the live executor's slices: a lease the policy granted, or one granted without it
LEASE, FORCED_LEASE = "lease", "forced lease"


@dataclass(frozen=True)
class Slice:
    """A sub-stage that ran on some GPUs.

    Attributes:
        gpus: GPU indices.
        start_s: begin, seconds.
        end_s: end, seconds.
        pipeline: pipeline name.
        step: step index.
        stage: stage name.
        name: sub-stage name.
        bound: ``compute`` | ``memory`` | ``comm`` | ``cpu`` | ``load``.
        flops: useful model FLOPs.
        inputs_ready_s: when the samples it consumes existed (streamed log-prob micro-batches), else ``None``.
        sm_shares: the smallest SM share leased on each of ``gpus`` over the slice (empty: 1 on each, exclusive).
    """

    gpus: tuple[int, ...]
    start_s: float
    end_s: float
    pipeline: str
    step: int
    stage: str
    name: str
    bound: str
    flops: float = 0.0
    inputs_ready_s: float | None = None
    sm_shares: tuple[float, ...] = ()

    @property
    def sm_share(self) -> float:
        """The smallest share it held on any of its GPUs (1: exclusive)."""
        return min(self.sm_shares, default=1.0)

    @property
    def forced(self) -> bool:
        """A live lease granted without the policy."""
        return self.name == FORCED_LEASE


@dataclass(frozen=True)
class MigrationRecord:
    """One executed :class:`~jigsaw_verl.policy.interface.Migrate` or
    :class:`~jigsaw_verl.policy.interface.WidenTail`.

    Attributes:
        time_s: when it happened, seconds.
        pipeline: pipeline name.
        sources: GPUs of the replicas emptied (a merge frees them all; a tail move may reuse some in ``targets``).
        targets: GPUs of the replicas that took the requests.
        requests: requests moved.
        reprefill_tokens: prompt + generated tokens the targets re-prefill.
        freed_gpu_s: GPU-seconds the sources would still have held without the migration (each source's
            longest remaining response decoded at its current step time), an estimate from the true lengths.
        wide_tp: for a tail move, the tensor-parallel size of the one new replica on ``targets``; 0 for a merge.
    """

    time_s: float
    pipeline: str
    sources: tuple[int, ...]
    targets: tuple[int, ...]
    requests: int
    reprefill_tokens: int
    freed_gpu_s: float
    wide_tp: int = 0


@dataclass(frozen=True)
class StageRecord:
    """When a stage of a step started and ended, and on how many GPUs it started."""

    pipeline: str
    step: int
    stage: str
    start_s: float
    end_s: float
    gpus: int = 0


@dataclass(frozen=True, kw_only=True)
class Timeline:
    """What report writers need of a run.

    Attributes:
        label: what ran (policy and configuration), for titles.
        num_slots: pool size.
        end_s: when the run ended (makespan), seconds.
        slices: everything that ran.
    """

    label: str
    num_slots: int
    end_s: float
    slices: tuple[Slice, ...]
