"""A pipeline's progress through its steps: which stages started and ended, when, and what is ready next.

Both executors keep one :class:`PipelineProgress` per pipeline and mark every stage start and end here, so the
snapshot's pipeline views (started, version, steps done, running since) mean the same in simulation and live.
:meth:`PipelineProgress.ready` is the step graph's dependency rule for an execution mode (the simulator asks it;
a live pipeline says itself what it waits for, since verl runs the graph).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from jigsaw_verl.model.graph import LOGPROB, ROLLOUT, STAGES, UPDATE, WEIGHT_SYNC
from jigsaw_verl.policy.interface import ExecutionMode, StageTiming


@dataclass(eq=False)
class PipelineProgress:
    """Where one pipeline is.

    Attributes:
        name: pipeline name.
        index: its position in the group (workload order, or order of joining).
        steps: steps it runs.
        arrival_s: when it joins (or joined) the pool, seconds.
        arrived: whether it has joined.
        finished: whether its last update ended.
        finish_s: when its last update ended, seconds.
        version: policy versions published to rollout (weight syncs done).
        steps_done: updates done.
        next_rollout: the step whose rollout starts next.
        status: ``(step, stage)`` -> ``"running"`` | ``"done"``.
        started_s: ``(step, stage)`` -> when it started, seconds.
        widths: ``(step, stage)`` -> slots it started on.
        changes: bumped by every stage start and end (what :meth:`ready` depends on, besides ``arrived``).
    """

    name: str
    index: int
    steps: int
    arrival_s: float
    arrived: bool = False
    finished: bool = False
    finish_s: float = 0.0
    version: int = 0
    steps_done: int = 0
    next_rollout: int = 0
    status: dict = field(default_factory=dict)
    started_s: dict = field(default_factory=dict)
    widths: dict = field(default_factory=dict)
    changes: int = 0

    def done(self, step: int, stage: str) -> bool:
        return self.status.get((step, stage)) == "done"

    def begun(self, step: int, stage: str) -> bool:
        return (step, stage) in self.status

    def start(self, step: int, stage: str, now: float, width: int) -> None:
        self.changes += 1
        self.status[(step, stage)] = "running"
        self.started_s[(step, stage)] = now
        self.widths[(step, stage)] = width
        if stage == ROLLOUT:
            self.next_rollout = step + 1

    def running_since(self, step: int, stage: str, now: float) -> float:
        """When a running stage began (``step`` -1: the latest rollout, whose replicas are live)."""
        return self.started_s.get((step if step >= 0 else self.next_rollout - 1, stage), now)

    def end(self, step: int, stage: str, now: float, finish_offsets_s: tuple[float, ...] = ()) -> StageTiming:
        """Mark a stage done; returns its timing for the history."""
        self.changes += 1
        self.status[(step, stage)] = "done"
        if stage == WEIGHT_SYNC:
            self.version += 1
        if stage == UPDATE:
            self.steps_done += 1
            if step == self.steps - 1:
                self.finished, self.finish_s = True, now
        return StageTiming(
            pipeline=self.name,
            step=step,
            stage=stage,
            start_s=self.started_s[(step, stage)],
            end_s=now,
            gpus=self.widths.get((step, stage), 0),
            finish_offsets_s=finish_offsets_s if stage == ROLLOUT else (),
        )

    def ready(self, mode: ExecutionMode) -> list[tuple[int, str]]:
        """The ``(step, stage)`` s whose dependencies are met under ``mode`` and that have not started."""
        if not self.arrived or self.finished:
            return []
        out = []
        k, steps = self.next_rollout, self.steps
        if k < steps:
            prev_ok = k == 0 or self.done(k - 1, ROLLOUT) or (mode.overlap_rollouts and self.begun(k - 1, ROLLOUT))
            if prev_ok and self.version >= k - mode.staleness:
                out.append((k, ROLLOUT))
        # NOTE: the training side (actor/critic/ref worker group) does one thing at a time, as in verl.
        if any(v == "running" and st != ROLLOUT for (_, st), v in self.status.items()):
            return out
        out += self._next_training(mode, steps)
        # NOTE: step order first, so publishing step k's weights comes before step k+1's log-prob passes.
        return sorted(out, key=lambda s: (s[0], STAGES.index(s[1])))

    def _next_training(self, mode: ExecutionMode, steps: int) -> list[tuple[int, str]]:
        out = []
        for j in range(steps):
            if not self.begun(j, LOGPROB):
                rolled = self.done(j, ROLLOUT) or (mode.stream_logprob and self.begun(j, ROLLOUT))
                if rolled and (j == 0 or self.done(j - 1, UPDATE)):
                    out.append((j, LOGPROB))
                break
        for j in range(steps):
            if not self.begun(j, UPDATE):
                if self.done(j, LOGPROB):
                    out.append((j, UPDATE))
                break
        for j in range(steps - 1):  # the last step publishes no weights: nothing rolls out after it
            if not self.begun(j, WEIGHT_SYNC):
                if self.done(j, UPDATE):
                    out.append((j, WEIGHT_SYNC))
                break
        return out
