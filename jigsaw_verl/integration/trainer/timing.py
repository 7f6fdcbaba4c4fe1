"""Wall-clock timing of the stages of a training step, as the live scheduler's predictor reads it.

Light (stdlib and the core only): the trainer subclasses feed it, a scheduler reads :attr:`StageTimer.timings`
or sets :attr:`StageTimer.on_step`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from jigsaw_verl.model.graph import LOGPROB, ROLLOUT, UPDATE, WEIGHT_SYNC
from jigsaw_verl.policy.interface import StageTiming

# sub-stage timed here -> the core stage it belongs to (what the scheduler leases workers for)
CORE_STAGE = {
    "rollout": ROLLOUT,
    "rollout_sleep": ROLLOUT,
    "old_log_prob": LOGPROB,
    "ref_log_prob": LOGPROB,
    "values": LOGPROB,
    "update_critic": UPDATE,
    "update_actor": UPDATE,
    "weight_sync": WEIGHT_SYNC,
}


class StageTimer:
    """Wall-clock spans of the stages of each training step, in ``time.monotonic()`` seconds.

    Args:
        pipeline: name put on the :class:`StageTiming` records.
        gpus: workers the pipeline's stages run on (the size of its resource pool).

    Attributes:
        spans: the current step's ``(sub-stage, start_s, end_s)``, in order.
        steps: per finished step, ``{sub-stage: seconds}`` (repeated calls summed), plus ``step``.
        timings: the finished steps as core :class:`StageTiming` records, one per core stage per step.
        on_step: called with ``(step, seconds_by_stage)`` after every step (e.g. by a live scheduler).
    """

    def __init__(self, pipeline: str = "pipeline", gpus: int = 1):
        self.pipeline = pipeline
        self.gpus = gpus
        self.spans: list[tuple[str, float, float]] = []
        self.steps: list[dict[str, float]] = []
        self.timings: list[StageTiming] = []
        self.on_step: Callable[[int, dict[str, float]], None] | None = None
        self._step_start: float | None = None
        self._outer: str | None = None

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time the block as sub-stage ``name``; blocks nested in another stage's block are not recorded."""
        if self._outer is not None:
            yield
            return
        self._outer, start = name, time.monotonic()
        try:
            yield
        finally:
            self._outer = None
            self.spans.append((name, start, time.monotonic()))

    def begin_step(self) -> None:
        self.spans = []
        self._step_start = time.monotonic()

    def seconds(self) -> dict[str, float]:
        """The current step's seconds per sub-stage so far."""
        out: dict[str, float] = {}
        for name, start, end in self.spans:
            out[name] = out.get(name, 0.0) + end - start
        if self._step_start is not None:
            out["step"] = time.monotonic() - self._step_start
        return out

    def end_step(self, step: int) -> dict[str, float]:
        """Close the current step; return its seconds per sub-stage."""
        seconds = self.seconds()
        self.steps.append(seconds)
        spans: dict[str, tuple[float, float]] = {}
        for name, start, end in self.spans:
            core = CORE_STAGE.get(name)
            if core is not None:
                s, e = spans.get(core, (start, end))
                spans[core] = (min(s, start), max(e, end))
        for core, (start, end) in spans.items():
            self.timings.append(
                StageTiming(pipeline=self.pipeline, step=step, stage=core, start_s=start, end_s=end, gpus=self.gpus)
            )
        self.spans, self._step_start = [], None
        if self.on_step is not None:
            self.on_step(step, seconds)
        return seconds
