"""The live executor: runs a core scheduling policy over pipelines that really run, by granting leases.

The simulator (:mod:`jigsaw_verl.sim.simulator`) is one executor of the core policies; this is the other. Each
joined pipeline asks for its next stage (``request``) and blocks until it is granted; it reports when the stage
ends (``finish``). At every change the executor builds the same immutable
:class:`~jigsaw_verl.core.scheduling.Snapshot` the simulator builds, calls the policy's ``schedule`` and turns the
:class:`~jigsaw_verl.core.scheduling.StartStage` actions for requested stages into grants. The policy object is
the one the simulator runs (``jigsaw_verl.sim.policies.POLICIES``), built over a
:class:`~jigsaw_verl.core.spec.WorkloadSpec` of the pipelines joined so far and rebuilt when one joins or leaves;
it learns the real stage times from the snapshot's ``history``.

What differs from the simulator, and why:
- A verl pipeline's worker groups are placed when it starts; a grant tells it *when* a stage may run and
  accounts the pool slots the policy chose for it (``gpus``, ``sm_share``), while the stage runs on the
  pipeline's own workers. The lease is what keeps two pipelines' stages from running on the same slots.
- Rollout replicas are not exposed as :class:`~jigsaw_verl.core.scheduling.ReplicaView` (live tail migration is
  done inside each pipeline by its :class:`~jigsaw_verl.rollout.tail_monitor.TailMonitor`), so the policy plans
  no ``Migrate`` and no co-location onto rollout tails here; it orders, defers and co-locates training stages.
- verl publishes weights after the last step too; that sync is granted without asking the policy, whose graph
  has no sync after the last step.
- If nothing runs and the policy still defers every requested stage, no event would ever wake it: the oldest
  request is granted on the pipeline's own width (``Grant.forced``) so the pool never deadlocks. A policy that
  raises is logged (``policy_errors``) and treated the same way.

No Ray, verl or torch here: tests drive it directly, and :mod:`.scheduler` wraps it in a Ray actor.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from ..core.catalogue import GPUSpec
from ..core.graph import ROLLOUT, STAGES, UPDATE, WEIGHT_SYNC
from ..core.memory import usable_bytes
from ..core.scheduling import (
    Lease,
    PipelineView,
    ReadyStage,
    Snapshot,
    StageTiming,
    StartStage,
)
from ..core.spec import ClusterSpec, PipelineSpec, WorkloadSpec

logger = logging.getLogger(__name__)


class PoolTooSmall(ValueError):
    """A pipeline needs more slots than the group's pool has."""


@dataclass(frozen=True)
class Grant:
    """Permission for ``pipeline`` to run ``stage`` of ``step`` now.

    Attributes:
        pipeline: pipeline name.
        step: step index.
        stage: one of :data:`~jigsaw_verl.core.graph.STAGES`.
        gpus: pool slots leased to it.
        sm_share: share of each slot (1 = exclusive).
        forced: granted without the policy (nothing else could ever wake the pool, or verl's post-training sync).
        start_s: when it was granted, seconds since the group started.
    """

    pipeline: str
    step: int
    stage: str
    gpus: tuple[int, ...]
    sm_share: float = 1.0
    forced: bool = False
    start_s: float = 0.0


@dataclass(frozen=True)
class LiveSlice:
    """A stage that ran: the lease it held, from grant to finish, seconds since the group started."""

    pipeline: str
    step: int
    stage: str
    gpus: tuple[int, ...]
    sm_share: float
    start_s: float
    end_s: float
    forced: bool


@dataclass
class _Pipe:
    spec: PipelineSpec
    index: int
    slots: int
    arrival_s: float
    requested: tuple[int, str] | None = None
    requested_s: float = 0.0
    running: dict[tuple[int, str], Grant] = field(default_factory=dict)
    done: set[tuple[int, str]] = field(default_factory=set)
    version: int = 0
    steps_done: int = 0
    train_gpus: tuple[int, ...] = ()


class LiveExecutor:
    """Runs ``policy`` over the pipelines that join a pool of ``num_slots`` slots.

    Args:
        num_slots: slots (GPUs, or CPU slots on the CPU backend) in the pool.
        gpu: the slot's hardware figures for the policy's cost model (its predictor corrects them online).
        policy: a name in ``jigsaw_verl.sim.policies.POLICIES`` (``jigsaw``, ``greedy``, a baseline...).
        seed: seed of the policy's predictor.
    """

    def __init__(self, num_slots: int, gpu: GPUSpec, *, policy: str = "jigsaw", seed: int = 0):
        from ..sim.policies import POLICIES

        if num_slots < 1:
            raise ValueError(f"the pool needs at least one slot, got {num_slots}")
        POLICIES.get(policy)  # unknown names fail here, before any pipeline joins
        self.num_slots, self.gpu, self.policy_name, self.seed = num_slots, gpu, policy, seed
        self.pipes: dict[str, _Pipe] = {}
        self.leases: list[list[tuple[str, int, str, float]]] = [[] for _ in range(num_slots)]
        self.last: list[str | None] = [None] * num_slots
        self.history: list[StageTiming] = []
        self.slices: list[LiveSlice] = []
        self.left: dict[str, str] = {}
        self.left_steps: dict[str, int] = {}
        self._policy = None
        self._next_index = 0
        self.policy_errors: list[str] = []

    # ---- membership ------------------------------------------------------------------------------------------
    def join(self, spec: PipelineSpec, slots: int, now: float) -> None:
        """Add a pipeline that runs its stages on ``slots`` slots."""
        if spec.name in self.pipes:
            raise ValueError(f"pipeline {spec.name!r} already joined this group")
        if slots > self.num_slots:
            raise PoolTooSmall(f"pipeline {spec.name!r} needs {slots} slots but the group's pool has {self.num_slots}")
        self.pipes[spec.name] = _Pipe(spec=spec, index=self._next_index, slots=slots, arrival_s=now)
        self._next_index += 1
        self._policy = None

    def leave(self, pipeline: str, now: float, reason: str = "finished") -> list[Grant]:
        """Remove a pipeline (finished, or crashed: its leases are reclaimed); returns new grants for others."""
        ps = self.pipes.pop(pipeline, None)
        if ps is None:
            return []
        for key in list(ps.running):
            self._end(ps, key, now, record=False)
        self.left[pipeline] = reason
        self.left_steps[pipeline] = ps.steps_done
        self._policy = None
        return self.decide(now)

    # ---- stage events ----------------------------------------------------------------------------------------
    def request(self, pipeline: str, step: int, stage: str, now: float) -> list[Grant]:
        """``pipeline`` waits to start ``stage`` of ``step``; returns the grants this decision made."""
        ps = self._pipe(pipeline)
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r} (stages: {', '.join(STAGES)})")
        if ps.requested is not None:
            raise ValueError(f"{pipeline} already waits for {ps.requested}; one request at a time")
        ps.requested, ps.requested_s = (step, stage), now
        return self.decide(now)

    def finish(self, pipeline: str, step: int, stage: str, now: float) -> list[Grant]:
        """``pipeline`` finished ``stage`` of ``step``; returns the grants this decision made."""
        ps = self._pipe(pipeline)
        if (step, stage) not in ps.running:
            raise ValueError(f"{pipeline} finished {stage} of step {step}, which was not granted")
        self._end(ps, (step, stage), now, record=True)
        return self.decide(now)

    def _pipe(self, pipeline: str) -> _Pipe:
        if pipeline not in self.pipes:
            raise KeyError(f"pipeline {pipeline!r} has not joined this group (joined: {sorted(self.pipes)})")
        return self.pipes[pipeline]

    def _end(self, ps: _Pipe, key: tuple[int, str], now: float, *, record: bool) -> None:
        grant = ps.running.pop(key)
        start = grant.start_s
        for g in grant.gpus:
            self.leases[g] = [entry for entry in self.leases[g] if entry[:3] != (ps.spec.name, key[0], key[1])]
        self.slices.append(
            LiveSlice(ps.spec.name, key[0], key[1], grant.gpus, grant.sm_share, start, now, grant.forced)
        )
        if not record:
            return
        ps.done.add(key)
        step, stage = key
        self.history.append(
            StageTiming(pipeline=ps.spec.name, step=step, stage=stage, start_s=start, end_s=now, gpus=len(grant.gpus))
        )
        if stage == UPDATE:
            ps.steps_done = max(ps.steps_done, step + 1)
            ps.train_gpus = grant.gpus
        if stage == WEIGHT_SYNC:
            ps.version = max(ps.version, step + 1)

    # ---- deciding --------------------------------------------------------------------------------------------
    def policy(self):
        """The policy over the pipelines joined now (built once per membership change)."""
        if self._policy is None and self.pipes:
            from ..sim.policies import POLICIES

            workload = WorkloadSpec(
                name="live",
                seed=self.seed,
                cluster=ClusterSpec(gpu=self.gpu, num_gpus=self.num_slots, gpus_per_node=self.num_slots),
                pipelines=tuple(p.spec for p in sorted(self.pipes.values(), key=lambda p: p.index)),
            )
            self._policy = POLICIES.get(self.policy_name)(workload)[0]
        return self._policy

    def free_slots(self) -> list[int]:
        return [g for g in range(self.num_slots) if not self.leases[g]]

    def snapshot(self, now: float) -> Snapshot:
        """What the policy sees now (the simulator's snapshot, from live state)."""
        ready, views = [], []
        for ps in sorted(self.pipes.values(), key=lambda p: p.index):
            if ps.requested is not None and not self._bypass(ps, *ps.requested):
                ready.append(ReadyStage(ps.spec.name, *ps.requested))
            running = tuple(
                (-1 if stage == ROLLOUT else step, stage, grant.gpus) for (step, stage), grant in ps.running.items()
            )
            views.append(
                PipelineView(
                    name=ps.spec.name,
                    index=ps.index,
                    arrival_s=ps.arrival_s,
                    arrived=True,
                    started=bool(ps.done or ps.running),
                    finished=False,
                    version=ps.version,
                    steps_done=ps.steps_done,
                    running=running,
                    running_since_s=tuple(grant.start_s for grant in ps.running.values()),
                    rollout_gpus=frozenset(g for (_, st), gr in ps.running.items() if st == ROLLOUT for g in gr.gpus),
                    train_gpus=ps.train_gpus,
                )
            )
        leases = tuple(
            tuple(Lease(pipeline=p, stage=st, sm_share=share) for p, _, st, share in self.leases[g])
            for g in range(self.num_slots)
        )
        room = usable_bytes(self.gpu)
        return Snapshot(
            now_s=now,
            num_gpus=self.num_slots,
            free_gpus=frozenset(self.free_slots()),
            ready=tuple(ready),
            pipelines=tuple(views),
            last_pipeline=tuple(self.last),
            leases=leases,
            free_bytes=tuple(room for _ in range(self.num_slots)),
            history=tuple(self.history),
        )

    def _bypass(self, ps: _Pipe, step: int, stage: str) -> bool:
        # verl syncs weights after the last step too; the core graph does not (nothing rolls out after it)
        return stage == WEIGHT_SYNC and step >= ps.spec.steps - 1

    def decide(self, now: float) -> list[Grant]:
        """Ask the policy what starts now; grant the requested stages it starts."""
        grants: list[Grant] = []
        for ps in list(self.pipes.values()):
            if ps.requested is not None and self._bypass(ps, *ps.requested):
                free = self.free_slots()
                want = len(ps.train_gpus or range(ps.slots))
                gpus = ps.train_gpus if set(ps.train_gpus) <= set(free) and ps.train_gpus else tuple(free[:want])
                if len(gpus) == want:  # else it waits for slots to free up, like any other stage
                    grants.append(self._grant(ps, gpus, 1.0, now, forced=True))
        if any(ps.requested is not None for ps in self.pipes.values()):
            try:
                actions = self.policy().schedule(self.snapshot(now)).actions
            except Exception as err:  # a policy bug must not stall every pipeline: grant in arrival order below
                logger.exception("policy %s failed; granting in arrival order", self.policy_name)
                self.policy_errors.append(f"{type(err).__name__}: {err}")
                actions = ()
            for action in actions:
                if not isinstance(action, StartStage):
                    continue  # Migrate: live tails are consolidated inside each pipeline (see module docstring)
                ps = self.pipes.get(action.pipeline)
                if ps is None or ps.requested != (action.step, action.stage) or not self._fits(action):
                    continue
                grants.append(self._grant(ps, tuple(sorted(action.gpus)), action.sm_share, now, forced=False))
        if not grants and not any(ps.running for ps in self.pipes.values()):
            waiting = sorted((ps for ps in self.pipes.values() if ps.requested), key=lambda p: p.requested_s)
            for ps in waiting[:1]:
                grants.append(self._grant(ps, tuple(range(ps.slots)), 1.0, now, forced=True))
        return grants

    def _fits(self, action: StartStage) -> bool:
        for g in action.gpus:
            held = self.leases[g] if 0 <= g < self.num_slots else None
            if held is None:
                return False
            if held and (action.sm_share >= 1.0 or len(held) > 1 or held[0][3] + action.sm_share > 1.0 + 1e-9):
                return False
        return True

    def _grant(self, ps: _Pipe, gpus: tuple[int, ...], share: float, now: float, *, forced: bool) -> Grant:
        step, stage = ps.requested
        grant = Grant(ps.spec.name, step, stage, gpus, share, forced, now)
        ps.requested = None
        ps.running[(step, stage)] = grant
        for g in gpus:
            if self.leases[g] and share < 1.0:  # the occupant's lease shrinks to the rest
                p, k, st, old = self.leases[g][0]
                self.leases[g][0] = (p, k, st, min(old, 1.0 - share))
            self.leases[g].append((ps.spec.name, step, stage, share))
            self.last[g] = ps.spec.name
        return grant
