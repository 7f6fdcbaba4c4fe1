"""The live scheduler: one named, detached Ray actor per ``jigsaw.mux.group`` that owns the group's pool.

Pipelines find it by name (:func:`get_scheduler`), join with their planning spec and slot need, then ask for
every stage before running it (``acquire``, which returns when the policy grants it) and report its end
(``release``). The actor runs a :class:`~jigsaw_verl.mux.executor.LiveExecutor` (the core policy, the same object
the simulator runs). A pipeline that dies is noticed by a watchdog that pings the actor it joined with; its
leases are reclaimed and the others go on. ``trace()`` returns every lease held, for the combined Perfetto trace
and utilisation plot the launcher writes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import asdict

import ray

from ..core.catalogue import GPUSpec
from ..core.spec import PipelineSpec
from .executor import Grant, LiveExecutor, PoolTooSmall

logger = logging.getLogger(__name__)

NAMESPACE = "jigsaw_mux"


def actor_name(group: str) -> str:
    return f"jigsaw-mux-{group}"


class MuxScheduler:
    """The pool of one multiplexing group (wrapped as a Ray actor by :func:`get_scheduler`).

    Args:
        group: group name.
        num_slots: slots in the pool.
        gpu: slot hardware for the policy's cost model.
        policy: policy name (``jigsaw`` by default).
        watchdog_s: how often joined pipelines are checked for life.
    """

    def __init__(self, group: str, num_slots: int, gpu: GPUSpec, policy: str = "jigsaw", watchdog_s: float = 1.0):
        self.group = group
        self.executor = LiveExecutor(num_slots, gpu, policy=policy)
        self.t0 = time.monotonic()
        self.watchdog_s = watchdog_s
        self._events: dict[tuple[str, int, str], asyncio.Event] = {}
        self._grants: dict[tuple[str, int, str], Grant] = {}
        self._owners: dict[str, object] = {}
        self._watchdog: asyncio.Task | None = None
        self.errors: dict[str, str] = {}

    def _now(self) -> float:
        return time.monotonic() - self.t0

    def _deliver(self, grants: list[Grant]) -> None:
        for g in grants:
            key = (g.pipeline, g.step, g.stage)
            self._grants[key] = g
            self._events.setdefault(key, asyncio.Event()).set()

    async def join(self, pipeline: PipelineSpec, slots: int, owner=None) -> dict:
        """Join the group with the pipeline's planning spec and slot need; ``owner`` is an actor handle whose
        death means the pipeline crashed. Raises :class:`PoolTooSmall` for a pipeline that cannot fit."""
        try:
            self.executor.join(pipeline, slots, self._now())
        except PoolTooSmall as err:
            self.errors[pipeline.name] = str(err)
            raise
        if owner is not None:
            self._owners[pipeline.name] = owner
        if self._watchdog is None:
            self._watchdog = asyncio.get_running_loop().create_task(self._watch())
        return {"group": self.group, "num_slots": self.executor.num_slots, "policy": self.executor.policy_name}

    async def acquire(self, pipeline: str, step: int, stage: str) -> dict:
        """Wait until ``stage`` of ``step`` is granted; return the grant."""
        key = (pipeline, step, stage)
        event = self._events.setdefault(key, asyncio.Event())
        self._deliver(self.executor.request(pipeline, step, stage, self._now()))
        await event.wait()
        self._events.pop(key, None)
        if key not in self._grants:
            raise RuntimeError(
                f"{pipeline} left group {self.group} while waiting for {stage} of step {step}: "
                f"{self.executor.left.get(pipeline, 'removed')}"
            )
        return asdict(self._grants.pop(key))

    async def release(self, pipeline: str, step: int, stage: str) -> None:
        """``stage`` of ``step`` ended."""
        self._deliver(self.executor.finish(pipeline, step, stage, self._now()))

    async def leave(self, pipeline: str, reason: str = "finished") -> None:
        """Leave the group (a finished pipeline); its leases, if any, go back to the pool."""
        self._owners.pop(pipeline, None)
        self._deliver(self.executor.leave(pipeline, self._now(), reason))
        for key, event in list(self._events.items()):
            if key[0] == pipeline:  # wake its waiting acquire, which then raises
                event.set()

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.watchdog_s)
            for name, owner in list(self._owners.items()):
                try:
                    await asyncio.wait_for(owner.__ray_ready__.remote(), timeout=30 * self.watchdog_s)
                except asyncio.TimeoutError:
                    continue  # a loaded machine answers late; only a dead actor counts
                except ray.exceptions.RayActorError as err:
                    logger.warning("pipeline %s of group %s is gone (%s); reclaiming its leases", name, self.group, err)
                    await self.leave(name, reason=f"crashed: {type(err).__name__}")

    def status(self) -> dict:
        ex = self.executor
        return {
            "group": self.group,
            "num_slots": ex.num_slots,
            "policy": ex.policy_name,
            "pipelines": {
                name: {
                    "steps": ps.spec.steps,
                    "steps_done": ps.steps_done,
                    "running": [f"{stage} of step {step}" for step, stage in ps.running],
                    "waiting": None if ps.requested is None else f"{ps.requested[1]} of step {ps.requested[0]}",
                }
                for name, ps in ex.pipes.items()
            },
            "left": dict(ex.left),
            "left_steps": dict(ex.left_steps),
            "free_slots": ex.free_slots(),
            "errors": dict(self.errors),
            "policy_errors": list(ex.policy_errors[-5:]),
        }

    def trace(self) -> list[dict]:
        """Every lease held so far (finished ones and those still running up to now)."""
        now = self._now()
        done = [asdict(s) for s in self.executor.slices]
        running = [
            {**asdict(g), "end_s": now, "running": True}
            for ps in self.executor.pipes.values()
            for g in ps.running.values()
        ]
        return done + running


class Presence:
    """A pipeline's token of life: an idle actor its trainer creates, so it dies with the trainer (Ray kills the
    actors a dead worker owns). The scheduler pings it; the trainer itself is too busy running ``fit`` to answer."""

    def alive(self) -> bool:
        return True


def get_scheduler(group: str, num_slots: int | None = None, gpu: GPUSpec | None = None, policy: str = "jigsaw"):
    """The group's scheduler actor: found by name, or created (detached) when ``num_slots`` and ``gpu`` are
    given. Ray must be initialised."""
    name = actor_name(group)
    try:
        return ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        if num_slots is None or gpu is None:
            raise LookupError(f"no multiplexing group {group!r} is running (actor {name} in {NAMESPACE})") from None
    return (
        ray.remote(MuxScheduler)
        .options(name=name, namespace=NAMESPACE, lifetime="detached", get_if_exists=True, num_cpus=0)
        .remote(group, num_slots, gpu, policy)
    )
