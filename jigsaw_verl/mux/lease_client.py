"""``StageLeases``: a pipeline's side of the live scheduler: join, then hold a lease around every stage.

The trainer (``trainer.v1.trainer_mode=jigsaw`` with ``jigsaw.enable=true``) calls ``begin(step, stage)`` before a
stage and ``end()`` after it; ``begin`` blocks until the group's scheduler grants the stage. Stage times reach the
scheduler's predictor through the grant/release pair. ``wait_s`` keeps how long each stage waited for its grant,
for the step's metrics.
"""

from __future__ import annotations

import time

import ray

from ..core.graph import STAGES
from .executor import PoolTooSmall
from .pipeline_spec import mux_pipeline_name, mux_slots, pipeline_spec_from_verl, slot_spec
from .scheduler import Presence, get_scheduler


class StageLeases:
    """Leases of one pipeline in a multiplexing group.

    Args:
        config: the run's verl config with its ``jigsaw.mux`` group.
    """

    def __init__(self, config):
        mux = config.jigsaw.mux
        self.pipeline = mux_pipeline_name(config)
        slots = mux_slots(config)
        gpu = slot_spec(str(config.trainer.get("device", "cuda")), mux.get("gpu"))
        pool = int(mux.get("pool_slots") or slots)
        self.scheduler = get_scheduler(str(mux.group), pool, gpu, str(mux.get("policy", "jigsaw")))
        spec = pipeline_spec_from_verl(self.pipeline, config)
        self.presence = ray.remote(Presence).options(num_cpus=0).remote()
        try:
            ray.get(self.scheduler.join.remote(spec, slots, self.presence))
        except ray.exceptions.RayTaskError as err:
            if isinstance(err.cause, PoolTooSmall):
                raise PoolTooSmall(f"jigsaw.mux.slots: {err.cause}") from None
            raise
        self.current: tuple[int, str] | None = None
        self.wait_s: dict[str, float] = {}

    def begin(self, step: int, stage: str) -> dict:
        """Block until ``stage`` of ``step`` is granted (ending the stage held before, if any)."""
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}")
        self.end()
        started = time.perf_counter()
        grant = ray.get(self.scheduler.acquire.remote(self.pipeline, step, stage))
        self.wait_s[stage] = self.wait_s.get(stage, 0.0) + time.perf_counter() - started
        self.current = (step, stage)
        return grant

    def end(self) -> None:
        """End the stage held now, if any."""
        if self.current is not None:
            ray.get(self.scheduler.release.remote(self.pipeline, *self.current))
            self.current = None

    def leave(self) -> None:
        """End the held stage and leave the group."""
        self.end()
        ray.get(self.scheduler.leave.remote(self.pipeline))

    def take_metrics(self) -> dict[str, float]:
        """``jigsaw/lease_wait_s/<stage>`` since the last call."""
        out = {f"jigsaw/lease_wait_s/{stage}": s for stage, s in self.wait_s.items()}
        self.wait_s = {}
        return out
