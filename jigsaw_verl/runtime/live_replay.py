"""A live group replayed on a simulated clock: the prediction of a live run, through the live mechanism itself.

The pipelines of the group join a real :class:`~jigsaw_verl.runtime.executor.LiveExecutor` with the planning
specs, slots, offload and engine reservations they joined the live group with (``group.json``), at the times they
joined, and ask for their leases in the order verl's trainer does under :mod:`jigsaw_verl.integration.trainer`:
start-up, the first weight sync handing over to the first rollout, then per step rollout, log-prob, update and
the weight sync that hands over to the next rollout (none after the last step: the pipeline leaves). The executor
applies the same registered policy as the live group's scheduler, with its grant, co-location, memory and deadlock
rules; so the replay credits a policy with exactly what the live runtime lets it do.

What each lease takes comes from a baseline run in which the pipeline ran alone on a home of the same width
(:class:`~jigsaw_verl.report.live_stage_times.AloneTimes`), and the trainer's work between two leases from the same
run. Leases that share a slot time-share it: on the CPU backend a slot is one pinned core (two processes on one
core each get half of it), so a lease runs at ``1 / n`` of its alone speed while ``n`` leases hold its busiest slot.
A pipeline's start-up (when it joined, what its start-up lease took, the trainer's work until it asked for its
first sync) is an input: the replayed run's own, where given, so the replay predicts the steady state that
follows. What it does not model: rollout migrations (no replica reports reach the executor) and helper processes
outside the slots.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from jigsaw_verl.model.catalogue import GPUSpec
from jigsaw_verl.model.engine_memory import EngineReservation
from jigsaw_verl.model.graph import INIT, LOGPROB, ROLLOUT, UPDATE, WEIGHT_SYNC
from jigsaw_verl.model.spec import PipelineSpec
from jigsaw_verl.model.topology import PoolTopology
from jigsaw_verl.report.live_stage_times import AloneTimes
from jigsaw_verl.runtime.executor import Grant, LiveExecutor
from jigsaw_verl.runtime.live_policy import live_policy_factory

EPS = 1e-9


@dataclass(frozen=True)
class ReplayPipeline:
    """One pipeline of the replayed group.

    Attributes:
        spec: its planning spec.
        slots: the slots it leases.
        times: what its leases take alone on ``slots`` slots, and its work between leases.
        joined_s: when it joined the group, seconds.
        offload: whether its training state leaves the devices between leases.
        engine: what its rollout engine reserves on each home slot.
        home: where it lives (``None``: the executor's rule picks).
        start_up: its start-up lease's seconds and the trainer's work from its end to the first sync's request, as
            the replayed run itself measured them (``None``: from ``times``).
    """

    spec: PipelineSpec
    slots: int
    times: AloneTimes
    joined_s: float = 0.0
    offload: bool = True
    engine: EngineReservation | None = None
    home: tuple[int, ...] | None = None
    start_up: tuple[float, float] | None = None

    def lease_s(self, step: int, stage: str) -> float:
        """What the lease takes alone, seconds."""
        if stage == INIT and self.start_up is not None:
            return self.start_up[0]
        return self.times.duration(step, stage)

    def gap_s(self, stage: str) -> float:
        """The trainer's work from the end of a lease of ``stage`` to its next request, seconds."""
        if stage == INIT and self.start_up is not None:
            return self.start_up[1]
        return self.times.gaps.get(stage, 0.0)


def lease_script(steps: int) -> list[tuple[str, int, str]]:
    """The calls a pipeline makes to the executor, in verl's trainer's order: ``(call, step, stage)`` with call
    ``request`` (ask, then wait for the grant) or ``handover`` (end the held lease, start this one at once); each
    lease ends when its work is done."""
    script = [("request", -1, INIT), ("request", -1, WEIGHT_SYNC), ("handover", 0, ROLLOUT)]
    for k in range(steps):
        script += [("request", k, LOGPROB), ("request", k, UPDATE)]
        if k + 1 < steps:
            script += [("request", k, WEIGHT_SYNC), ("handover", k + 1, ROLLOUT)]
    return script


@dataclass
class _Runner:
    """A pipeline's position in its script and the lease it holds."""

    pipe: ReplayPipeline
    script: list[tuple[str, int, str]]
    at: int = 0
    held: tuple[int, str] | None = None
    grant: Grant | None = None
    left_s: float = 0.0  # alone seconds of work left in the held lease
    elapsed: dict = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.pipe.spec.name


@dataclass(frozen=True)
class ReplayResult:
    """A replayed run: every lease as ``leases.json`` holds it, and the executor's policy errors."""

    leases: list[dict]
    policy_errors: tuple[str, ...]


class LiveReplay:
    """Replay ``pipelines`` as one group on a pool under ``policy`` (a name the live runtime can run).

    Args:
        pipelines: the group's pipelines.
        topology: the pool's shape.
        gpu: the slot hardware the live group planned with (its memory sized as the group's).
        policy: the registered policy.
        policy_factory: builds the policy (default: the live runtime's factory for ``policy``).
    """

    def __init__(
        self,
        pipelines: list[ReplayPipeline],
        topology: PoolTopology,
        gpu: GPUSpec,
        policy: str,
        policy_factory: Callable | None = None,
    ):
        factory = policy_factory or live_policy_factory(policy)
        self.executor = LiveExecutor(topology.num_slots, gpu, factory, policy_name=policy, topology=topology)
        self.executor.plan_homes({p.spec.name: p.home for p in pipelines if p.home is not None})
        self.runners = {p.spec.name: _Runner(p, lease_script(p.spec.steps)) for p in pipelines}
        self.now = 0.0
        self._calls: list[tuple[float, int, str]] = []  # (time, order, pipeline): its next call is due
        self._order = 0
        for p in pipelines:
            self._due(p.joined_s, p.spec.name)

    def _due(self, t: float, name: str) -> None:
        heapq.heappush(self._calls, (t, self._order, name))
        self._order += 1

    def run(self, max_events: int = 1_000_000) -> ReplayResult:
        """Replay to the end (``RuntimeError`` naming who waits when the group stalls)."""
        for _ in range(max_events):
            running = [r for r in self.runners.values() if r.held is not None]
            finish = min((self.now + r.left_s / self._rate(r) for r in running), default=float("inf"))
            call = self._calls[0][0] if self._calls else float("inf")
            if finish == call == float("inf"):
                return self._result()
            self._advance(min(finish, call), running)
            for r in running:
                if r.left_s <= EPS:
                    self._end(r)
            while self._calls and self._calls[0][0] <= self.now + EPS:
                _, _, name = heapq.heappop(self._calls)
                self._call(self.runners[name])
        raise RuntimeError(f"the replay did not end within {max_events} events")

    def _rate(self, r: _Runner) -> float:
        """A lease's speed over its alone speed: ``1 / n`` with ``n`` leases on its busiest slot (time-sharing)."""
        return 1.0 / max(len(self.executor.holds.on(g)) for g in r.grant.gpus)

    def _advance(self, t: float, running: list[_Runner]) -> None:
        for r in running:
            r.left_s -= (t - self.now) * self._rate(r)
        self.now = t

    def _call(self, r: _Runner) -> None:
        """Make the runner's next call (it has no lease and is not waiting)."""
        if r.at == 0:
            self.executor.join(r.pipe.spec, r.pipe.slots, self.now, offload=r.pipe.offload, engine=r.pipe.engine)
        call, step, stage = r.script[r.at]
        r.at += 1
        self._granted(self.executor.request(r.name, step, stage, self.now))

    def _end(self, r: _Runner) -> None:
        """The held lease's work is done: hand over, or end it and make the next call after the trainer's gap."""
        step, stage = r.held
        r.held = None
        if r.at < len(r.script) and r.script[r.at][0] == "handover":
            _, nstep, nstage = r.script[r.at]
            r.at += 1
            self._granted(self.executor.handover(r.name, step, stage, nstep, nstage, self.now))
            return
        offsets = self._offsets(r, step) if stage == ROLLOUT else ()
        grants = self.executor.finish(r.name, step, stage, self.now, offsets)
        if r.at >= len(r.script):
            grants += self.executor.leave(r.name, self.now)
        else:
            self._due(self.now + r.pipe.gap_s(stage), r.name)
        self._granted(grants)

    def _offsets(self, r: _Runner, step: int) -> tuple[float, ...]:
        """The rollout's live-batch curve: the baseline's, stretched to the time it took here."""
        alone = r.pipe.times.duration(step, ROLLOUT)
        took = self.now - r.grant.start_s
        return tuple(t * took / alone for t in r.pipe.times.finish_offsets.get(step, ())) if alone > 0 else ()

    def _granted(self, grants: list[Grant]) -> None:
        for g in grants:
            r = self.runners[g.pipeline]
            r.held, r.grant = (g.step, g.stage), g
            r.left_s = r.pipe.lease_s(g.step, g.stage)

    def _result(self) -> ReplayResult:
        stuck = [r.name for r in self.runners.values() if r.at < len(r.script) or r.held is not None]
        if stuck:
            waiting = {n: self.executor.pipes[n].requested for n in stuck if n in self.executor.pipes}
            raise RuntimeError(f"the replay stalled at t={self.now:.1f}s: {', '.join(stuck)} wait ({waiting})")
        leases = [{**asdict(s), "sm_share": s.sm_share, "forced": s.forced} for s in self.executor.slices]
        return ReplayResult(leases, tuple(self.executor.policy_errors))
