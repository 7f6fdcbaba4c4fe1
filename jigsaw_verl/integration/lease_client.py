"""``StageLeases``: a pipeline's side of the live scheduler: join, then hold a lease around every stage.

The trainer (``trainer.v1.trainer_mode=jigsaw`` with ``jigsaw.enable=true``) calls ``begin(step, stage)`` before a
stage and ``end()`` after it; ``begin`` blocks until the group's scheduler grants the stage. Stage times reach the
scheduler's predictor through the grant/release pair. ``wait_s`` keeps how long each stage waited for its grant,
for the step's metrics.
"""

from __future__ import annotations

import re
import time

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from jigsaw_verl.integration.pipeline_spec import (
    engine_reservation_from_verl,
    mux_pipeline_name,
    mux_pool_nodes,
    mux_pool_slots,
    mux_slot_spec,
    mux_slots,
    pipeline_spec_from_verl,
)
from jigsaw_verl.integration.settings import JigsawConfigError, MuxSettings
from jigsaw_verl.model.graph import OUTSIDE_STAGES, STAGES
from jigsaw_verl.runtime.executor import EngineMemoryRefused, PolicyRefused, PoolTooSmall
from jigsaw_verl.runtime.ledger_actor import find_ledger
from jigsaw_verl.runtime.pool_placement import PoolPlacement
from jigsaw_verl.runtime.scheduler import Presence, get_scheduler


class StageLeases:
    """Leases of one pipeline in a multiplexing group.

    Args:
        mux: the pipeline's ``jigsaw.mux`` settings.
        config: the run's verl config (the trainer's device and GPUs, the planning spec's model and batch).
        steps: the steps the trainer trains (its ``total_training_steps``, by verl's rule).
    """

    def __init__(self, mux: MuxSettings, config, *, steps: int):
        if not mux.group:
            raise JigsawConfigError("jigsaw.enable=true needs jigsaw.mux.group: the multiplexing group to join")
        self.pipeline = mux_pipeline_name(mux, config)
        slots = mux_slots(mux, config)
        self.slots = slots
        spec = pipeline_spec_from_verl(self.pipeline, config, steps=steps)
        pool, nodes = mux_pool_slots(mux, config), mux_pool_nodes(mux, config)
        slot = mux_slot_spec(mux, config, spec)
        self.scheduler = get_scheduler(mux.group, pool, slot, mux.policy, mux.max_pipelines, nodes=nodes)
        engine = engine_reservation_from_verl(mux, config, spec)
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        # on the trainer's own node: it dies with the trainer, never with another node
        self.presence = ray.remote(Presence).options(num_cpus=0, scheduling_strategy=here).remote()
        try:
            ray.get(self.scheduler.join.remote(spec, slots, self.presence, offload=mux.offload, engine=engine))
        except ray.exceptions.RayTaskError as err:
            if isinstance(err.cause, PoolTooSmall):
                raise PoolTooSmall(f"jigsaw.mux.slots: {err.cause}") from None
            if isinstance(err.cause, (PolicyRefused, EngineMemoryRefused)):
                raise type(err.cause)(str(err.cause)) from None
            raise
        self.current: tuple[int, str] | None = None
        self.granted_at = 0.0  # wall time of the held stage's grant
        self.wait_s: dict[str, float] = {}
        self.residency = None  # a LeaseResidency once the pipeline's workers exist

    def pool(self, device_resource: str) -> PoolPlacement:
        """The group's pool placement group (made by the scheduler at the first call) and this pipeline's home.
        Where the pool has a device-memory ledger (the CPU backend), this pipeline's Ray job is registered with it
        first, so every process of the job charges it as this pipeline."""
        placement = ray.get(self.scheduler.pool.remote(device_resource, self.pipeline))
        ledger = find_ledger(placement.group)
        if ledger is not None:  # rank r of the pipeline's workers goes to slot first_slot + r (shared_pool)
            home = list(range(placement.first_slot, placement.first_slot + self.slots))
            ray.get(ledger.register.remote(ray.get_runtime_context().get_job_id(), self.pipeline, home))
        return placement

    def report_placement(self, workers: list) -> list[dict]:
        """Ask each worker actor which placement group, bundle and node it runs in; tell the scheduler; return it."""

        def where(worker_self):
            context = ray.get_runtime_context()
            pg = context.get_placement_group_id()
            return {"placement_group_id": pg, "bundle": bundle_index(context), "node_id": context.get_node_id()}

        answers = ray.get([w.__ray_call__.remote(where) for w in workers])
        ray.get(self.scheduler.placed.remote(self.pipeline, answers))
        return answers

    def begin(self, step: int, stage: str) -> dict:
        """Block until ``stage`` of ``step`` is granted (ending the stage held before, if any)."""
        if stage not in STAGES + OUTSIDE_STAGES:
            raise ValueError(f"unknown stage {stage!r}")
        self.end()
        return self._hold(step, stage, lambda: self.scheduler.acquire.remote(self.pipeline, step, stage))

    def handover(self, step: int, stage: str) -> dict:
        """End the held stage and start ``stage`` of ``step`` on its slots at once, without waiting for the policy:
        the pipeline's rollout engines are awake across the two (a weight sync, start-up or validation followed by a
        rollout), so no moment passes outside a lease."""
        if self.current is None:
            raise RuntimeError(f"{self.pipeline} holds no lease to hand over to {stage} of step {step}")
        if self.residency is not None:
            self.residency.offload(self.current[1])
        held = self.current
        return self._hold(step, stage, lambda: self.scheduler.handover.remote(self.pipeline, *held, step, stage))

    def _hold(self, step: int, stage: str, ask) -> dict:
        """Wait for the grant ``ask()`` returns (counting the wait), then hold ``stage`` of ``step`` and bring on the
        state it computes with."""
        started = time.perf_counter()
        grant = ray.get(ask())
        self.wait_s[stage] = self.wait_s.get(stage, 0.0) + time.perf_counter() - started
        self.current = (step, stage)
        self.granted_at = time.time()
        if self.residency is not None:
            self.residency.onload(stage)
        return grant

    def end(self, finish_times: list[float] | None = None) -> None:
        """End the stage held now, if any (a rollout: with the wall times its responses finished at)."""
        if self.current is not None:
            if self.residency is not None:
                self.residency.offload(self.current[1])
            offsets = tuple(max(0.0, t - self.granted_at) for t in finish_times or ())
            ray.get(self.scheduler.release.remote(self.pipeline, *self.current, offsets))
            self.current = None

    async def report_replicas(self, replicas: list[dict]) -> list[dict]:
        """The held rollout's replicas now (``ReplicaReport`` fields); returns the group's migration orders."""
        if self.current is None:
            return []
        return await self.scheduler.report_replicas.remote(self.pipeline, self.current[0], replicas)

    async def migrated(self, sources: list[int]) -> None:
        """Replica ranks ``sources`` of the held rollout hold no requests any more: their slots can go."""
        if self.current is not None:
            await self.scheduler.migrated.remote(self.pipeline, self.current[0], list(sources))

    def leave(self, reason: str = "finished") -> None:
        """End the held stage and leave the group, saying why (``"finished"``, or how the trainer failed: the
        scheduler names a lost node only for a pipeline that had not finished)."""
        self.end()
        ray.get(self.scheduler.leave.remote(self.pipeline, reason))

    def take_metrics(self) -> dict[str, float]:
        """``jigsaw/lease_wait_s/<stage>`` (and the residency's moves) since the last call."""
        out = {f"jigsaw/lease_wait_s/{stage}": s for stage, s in self.wait_s.items()}
        self.wait_s = {}
        if self.residency is not None:
            out.update(self.residency.take_metrics())
        return out


def bundle_index(context) -> int | None:
    """The placement-group bundle a verl worker was placed in: verl names each worker
    ``{prefix}{cls}_{pg_index}:{bundle}`` and places it in that bundle (``RayWorkerGroup._create_worker``,
    ``verl/single_controller/ray/base.py``); ``None`` for an actor not named so."""
    found = re.fullmatch(r".+_\d+:(\d+)", context.get_actor_name() or "")
    return int(found.group(1)) if found else None
