"""The live executor: runs a core scheduling policy over pipelines that really run, by granting leases.

The simulator (:mod:`jigsaw_verl.sim.simulator`) is one executor of the core policies; this is the other. Each
joined pipeline asks for its next stage (``request``) and blocks until it is granted; it reports when the stage
ends (``finish``). At every change the executor builds the same immutable
:class:`~jigsaw_verl.policy.interface.Snapshot` the simulator builds, calls the policy's ``schedule`` and turns the
:class:`~jigsaw_verl.policy.interface.StartStage` actions for requested stages into grants. The policy object is
the one the simulator runs (``jigsaw_verl.policy.catalog.POLICIES``), built over a
:class:`~jigsaw_verl.model.spec.WorkloadSpec` of the pipelines joined so far and rebuilt when one joins or leaves;
it learns the real stage times from the snapshot's ``history``.

What differs from the simulator, and why:
- A verl pipeline's worker groups are placed once, when it starts: rank ``r`` in the pool's slot
  ``home[r]`` (its *home*, a contiguous run of slots the executor picks at join, spreading pipelines over the
  pool). Every stage of it runs there, so the policy decides *when* a stage runs and whether it shares its slots
  (``sm_share``); a grant is always on the pipeline's home. A planned start elsewhere is granted on the home when
  the home can take it, and waits otherwise. The leases are thus where the work really is, and what keeps two
  pipelines' stages from running on the same slots at full share. A share below 1 is granted on slots each held
  by one other pipeline's lease (the policy's co-location, which checked the occupant can take a newcomer): the
  occupant's share shrinks to the rest until the newcomer ends. Each hold keeps its share segments, so the
  slices (``slices``, ``open_slices``) never sum to more than 1 on a slot.
- A running rollout's replicas are what its pipeline reports (``report_replicas``: live, queued and context per
  replica rank, from its load balancer). They become the snapshot's
  :class:`~jigsaw_verl.policy.interface.ReplicaView` s and the rollout leases' replica ids, so the policy sees
  tails as the simulator does: it may co-locate onto them and plan a
  :class:`~jigsaw_verl.policy.interface.Migrate`. A ``Migrate`` becomes a :class:`MigrationOrder` the pipeline
  takes with its next report and runs through its migrator; the source slots stay leased until the pipeline
  says the migration is done (``migrated``), then the rollout's lease shrinks to the targets and the freed slots
  go to whoever the policy picks. Replica ``r`` runs on home slots ``r * tp`` to ``(r + 1) * tp - 1`` (verl's
  rollout replicas over its worker ranks).
- A finished rollout reports when each response finished (``finish_offsets_s``, from the load balancer's
  releases); that live-batch curve goes into the stage's history for the predictor.
- verl publishes weights after the last step too; that sync is granted without asking the policy, whose graph
  has no sync after the last step.
- If nothing runs and the policy still defers every requested stage, no event would ever wake it: the oldest
  request is granted on the pipeline's own width (``Grant.forced``) so the pool never deadlocks. A policy that
  raises is logged (``policy_errors``) and treated the same way.

No Ray, verl or torch here: tests drive it directly, and :mod:`.scheduler` wraps it in a Ray actor.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace

from jigsaw_verl.model.catalogue import GPUSpec
from jigsaw_verl.model.graph import ROLLOUT, STAGES, UPDATE, WEIGHT_SYNC
from jigsaw_verl.model.memory import usable_bytes
from jigsaw_verl.model.spec import ClusterSpec, PipelineSpec, WorkloadSpec
from jigsaw_verl.policy.interface import (
    Lease,
    Migrate,
    PipelineView,
    ReadyStage,
    ReplicaView,
    Snapshot,
    StageTiming,
)

logger = logging.getLogger(__name__)

# a replica's id in the snapshot: pipeline index * stride + replica rank (unique within the group)
REPLICA_ID_STRIDE = 10_000


class PoolTooSmall(ValueError):
    """A pipeline needs more slots than the group's pool has."""


@dataclass(frozen=True)
class Grant:
    """Permission for ``pipeline`` to run ``stage`` of ``step`` now.

    Attributes:
        pipeline: pipeline name.
        step: step index.
        stage: one of :data:`~jigsaw_verl.model.graph.STAGES`.
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


@dataclass(frozen=True)
class ReplicaReport:
    """One rollout replica as its pipeline reports it.

    Attributes:
        rank: the replica's rank in the pipeline's rollout (its position in verl's server list).
        live: requests generating there.
        queued: requests waiting for admission there.
        context_tokens: prompt + generated tokens of its live requests.
        generated_tokens: tokens its live requests generated so far.
    """

    rank: int
    live: int
    queued: int = 0
    context_tokens: int = 0
    generated_tokens: int = 0


@dataclass(frozen=True)
class MigrationOrder:
    """The policy's :class:`~jigsaw_verl.policy.interface.Migrate` in a pipeline's replica ranks: move every
    request off ``sources`` onto ``targets`` (then report :meth:`LiveExecutor.migrated`)."""

    pipeline: str
    step: int
    sources: tuple[int, ...]
    targets: tuple[int, ...]


@dataclass
class _Held:
    """One lease's hold on one slot: its current share since ``since`` (a co-located newcomer shrinks it; the
    newcomer's end gives it back)."""

    pipeline: str
    step: int
    stage: str
    share: float
    since: float
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
    home: tuple[int, ...] = ()
    # the running rollout's replicas, by rank, as last reported; ranks ordered away / already migrated away
    replicas: dict[int, ReplicaReport] = field(default_factory=dict)
    migrating: set[int] = field(default_factory=set)
    gone: set[int] = field(default_factory=set)
    orders: list[MigrationOrder] = field(default_factory=list)


def _slices(holds: list[tuple[int, _Held]], end_s: float) -> list[LiveSlice]:
    """``(slot, hold)`` pairs as slices ending at ``end_s``: one per segment (same lease, share and start) over all
    its slots."""
    merged: dict[tuple, list[int]] = {}
    for g, h in holds:
        merged.setdefault((h.pipeline, h.step, h.stage, h.share, h.since, h.forced), []).append(g)
    return [
        LiveSlice(pipeline, step, stage, tuple(sorted(gpus)), share, since, end_s, forced)
        for (pipeline, step, stage, share, since, forced), gpus in merged.items()
    ]


class LiveExecutor:
    """Runs ``policy`` over the pipelines that join a pool of ``num_slots`` slots.

    Args:
        num_slots: slots (GPUs, or CPU slots on the CPU backend) in the pool.
        gpu: the slot's hardware figures for the policy's cost model (its predictor corrects them online).
        policy: a name in ``jigsaw_verl.policy.catalog.POLICIES`` (``jigsaw``, ``greedy``, a baseline...).
        seed: seed of the policy's predictor.
    """

    def __init__(self, num_slots: int, gpu: GPUSpec, *, policy: str = "jigsaw", seed: int = 0):
        from jigsaw_verl.policy.catalog import POLICIES

        if num_slots < 1:
            raise ValueError(f"the pool needs at least one slot, got {num_slots}")
        POLICIES.get(policy)  # unknown names fail here, before any pipeline joins
        self.num_slots, self.gpu, self.policy_name, self.seed = num_slots, gpu, policy, seed
        self.pipes: dict[str, _Pipe] = {}
        self.leases: list[list[_Held]] = [[] for _ in range(num_slots)]
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
        home = self._pick_home(slots)
        self.pipes[spec.name] = _Pipe(spec=spec, index=self._next_index, slots=slots, arrival_s=now, home=home)
        self._next_index += 1
        self._policy = None

    def home(self, pipeline: str) -> tuple[int, ...]:
        """The slots a pipeline's workers are placed on (rank ``r`` on ``home[r]``)."""
        return self._pipe(pipeline).home

    def _pick_home(self, slots: int) -> tuple[int, ...]:
        """The contiguous run of ``slots`` slots the fewest joined pipelines live on (the lowest such run)."""
        load = [0] * self.num_slots
        for ps in self.pipes.values():
            for g in ps.home:
                load[g] += 1
        start = min(range(self.num_slots - slots + 1), key=lambda s: (sum(load[s : s + slots]), s))
        return tuple(range(start, start + slots))

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

    def finish(
        self, pipeline: str, step: int, stage: str, now: float, finish_offsets_s: tuple[float, ...] = ()
    ) -> list[Grant]:
        """``pipeline`` finished ``stage`` of ``step`` (a rollout: with when each response finished, seconds after
        its grant); returns the grants this decision made."""
        ps = self._pipe(pipeline)
        if (step, stage) not in ps.running:
            raise ValueError(f"{pipeline} finished {stage} of step {step}, which was not granted")
        self._end(ps, (step, stage), now, record=True, finish_offsets_s=tuple(sorted(finish_offsets_s)))
        return self.decide(now)

    # ---- rollout replicas and migrations ---------------------------------------------------------------------
    def report_replicas(
        self, pipeline: str, step: int, replicas: list[ReplicaReport], now: float
    ) -> tuple[list[Grant], list[MigrationOrder]]:
        """The running rollout's replicas now; returns new grants and the pipeline's pending migration orders
        (each handed out once). Reports for a rollout that is not running are ignored."""
        ps = self._pipe(pipeline)
        if (step, ROLLOUT) not in ps.running:
            return [], []
        ps.replicas = {r.rank: r for r in replicas if r.rank not in ps.gone}
        grants = self.decide(now) if any(p.requested is not None for p in self.pipes.values()) else []
        orders, ps.orders = ps.orders, []
        return grants, orders

    def migrated(self, pipeline: str, step: int, sources: tuple[int, ...], now: float) -> list[Grant]:
        """The pipeline moved every request off replica ranks ``sources`` (an order, or its own tail policy):
        the rollout's lease shrinks to the slots of its other replicas and the freed slots go back to the pool."""
        ps = self._pipe(pipeline)
        key = (step, ROLLOUT)
        if key not in ps.running:
            return []
        grant = ps.running[key]
        slots = self._replica_slots(ps, grant)
        freed = tuple(sorted(g for r in sources for g in slots.get(r, ())))
        ps.migrating -= set(sources)
        ps.gone |= set(sources)
        for r in sources:
            ps.replicas.pop(r, None)
        if not freed or len(freed) >= len(grant.gpus):
            return []
        self._release_slots(pipeline, key, freed, now)
        ps.running[key] = replace(grant, gpus=tuple(g for g in grant.gpus if g not in freed))
        return self.decide(now)

    def _replica_slots(self, ps: _Pipe, grant: Grant) -> dict[int, tuple[int, ...]]:
        """Replica rank -> the slots it runs on: ``rollout_tp`` home slots each, in rank order (verl puts rollout
        replica ``r`` on workers ``r * tp`` to ``(r + 1) * tp - 1``); only the ranks still in the lease."""
        tp = max(1, ps.spec.rollout_tp)
        if ps.slots % tp:
            return {}
        held = set(grant.gpus)
        slots = {r: tuple(ps.home[r * tp : (r + 1) * tp]) for r in range(ps.slots // tp)}
        return {r: gs for r, gs in slots.items() if set(gs) <= held}

    def _order(self, action: Migrate) -> None:
        """Turn the policy's ``Migrate`` into an order for its pipeline (once per replica)."""
        ps = self.pipes.get(action.pipeline)
        running = [k for k in (ps.running if ps else {}) if k[1] == ROLLOUT]
        if not running:
            return
        base = ps.index * REPLICA_ID_STRIDE
        ranks = {r - base for r in (*action.sources, *action.targets)}
        if not ranks <= set(ps.replicas) or ranks & ps.migrating:
            return  # stale: planned on replicas that changed since
        sources = tuple(r - base for r in action.sources)
        targets = tuple(r - base for r in action.targets)
        ps.migrating |= set(sources)
        ps.orders.append(MigrationOrder(action.pipeline, running[0][0], sources, targets))

    def _pipe(self, pipeline: str) -> _Pipe:
        if pipeline not in self.pipes:
            raise KeyError(f"pipeline {pipeline!r} has not joined this group (joined: {sorted(self.pipes)})")
        return self.pipes[pipeline]

    def _end(
        self, ps: _Pipe, key: tuple[int, str], now: float, *, record: bool, finish_offsets_s: tuple[float, ...] = ()
    ) -> None:
        grant = ps.running.pop(key)
        if key[1] == ROLLOUT:
            ps.replicas, ps.migrating, ps.gone, ps.orders = {}, set(), set(), []
        start = grant.start_s
        self._release_slots(ps.spec.name, key, grant.gpus, now)
        if not record:
            return
        ps.done.add(key)
        step, stage = key
        self.history.append(
            StageTiming(
                pipeline=ps.spec.name,
                step=step,
                stage=stage,
                start_s=start,
                end_s=now,
                gpus=len(ps.home),  # every grant is on the home; a migration may have shrunk a rollout's since
                finish_offsets_s=finish_offsets_s if stage == ROLLOUT else (),
            )
        )
        if stage == UPDATE:
            ps.steps_done = max(ps.steps_done, step + 1)
            ps.train_gpus = grant.gpus
        if stage == WEIGHT_SYNC:
            ps.version = max(ps.version, step + 1)

    # ---- slot holds and the slices they leave ---------------------------------------------------------------
    def _release_slots(self, pipeline: str, key: tuple[int, str], gpus, now: float) -> None:
        """End ``pipeline``'s hold of ``key`` on ``gpus``; a co-located occupant left alone gets its slot back."""
        closed = []
        for g in gpus:
            mine = [h for h in self.leases[g] if (h.pipeline, h.step, h.stage) == (pipeline, *key)]
            for h in mine:
                closed.append((g, h))
                self.leases[g].remove(h)
            if len(self.leases[g]) == 1 and self.leases[g][0].share < 1.0:
                closed.append((g, self._reshare(self.leases[g][0], 1.0, now)))
        self._record(closed, now)

    def _reshare(self, held: _Held, share: float, now: float) -> _Held:
        """Change a hold's share from now on; returns the segment that ended (for :meth:`_record`)."""
        ended = replace(held)
        held.share, held.since = share, now
        return ended

    def _record(self, closed: list[tuple[int, _Held]], now: float) -> None:
        """One slice per lease segment that ended now, over every slot it held at that share since then."""
        self.slices.extend(_slices(closed, now))

    def open_slices(self, now: float) -> list[LiveSlice]:
        """The holds running now, as slices up to ``now``."""
        return _slices([(g, h) for g, holds in enumerate(self.leases) for h in holds], now)

    # ---- deciding --------------------------------------------------------------------------------------------
    def policy(self):
        """The policy over the pipelines joined now (built once per membership change)."""
        if self._policy is None and self.pipes:
            from jigsaw_verl.policy.catalog import POLICIES

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
        replicas, replica_of = self._replica_views()
        leases = tuple(
            tuple(
                Lease(
                    pipeline=h.pipeline,
                    stage=h.stage,
                    sm_share=h.share,
                    replica=replica_of.get(g) if h.stage == ROLLOUT else None,
                )
                for h in self.leases[g]
            )
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
            replicas=replicas,
            history=tuple(self.history),
        )

    def _replica_views(self) -> tuple[tuple[ReplicaView, ...], dict[int, int]]:
        """The running rollouts' reported replicas (not those ordered or migrated away), and slot -> replica id."""
        views, replica_of = [], {}
        for ps in sorted(self.pipes.values(), key=lambda p: p.index):
            for (step, stage), grant in ps.running.items():
                if stage != ROLLOUT or not ps.replicas:
                    continue
                slots = self._replica_slots(ps, grant)
                for rank, rep in sorted(ps.replicas.items()):
                    if rank in ps.migrating or rank not in slots:
                        continue
                    rid = ps.index * REPLICA_ID_STRIDE + rank
                    replica_of.update((g, rid) for g in slots[rank])
                    views.append(
                        ReplicaView(
                            replica=rid,
                            pipeline=ps.spec.name,
                            step=step,
                            gpus=slots[rank],
                            live=rep.live,
                            queued=rep.queued,
                            context_tokens=rep.context_tokens,
                            generated_tokens=rep.generated_tokens,
                            started_s=grant.start_s,
                        )
                    )
        return tuple(views), replica_of

    def _bypass(self, ps: _Pipe, step: int, stage: str) -> bool:
        # verl syncs weights after the last step too; the core graph does not (nothing rolls out after it)
        return stage == WEIGHT_SYNC and step >= ps.spec.steps - 1

    def decide(self, now: float) -> list[Grant]:
        """Ask the policy what starts now; grant the requested stages it starts."""
        grants: list[Grant] = []
        for ps in list(self.pipes.values()):
            if ps.requested is not None and self._bypass(ps, *ps.requested):
                free = self.free_slots()
                if set(ps.home) <= set(free):  # else it waits for its home to free up, like any other stage
                    grants.append(self._grant(ps, ps.home, 1.0, now, forced=True))
        if any(ps.requested is not None for ps in self.pipes.values()):
            try:
                actions = self.policy().schedule(self.snapshot(now)).actions
            except Exception as err:  # a policy bug must not stall every pipeline: grant in arrival order below
                logger.exception("policy %s failed; granting in arrival order", self.policy_name)
                self.policy_errors.append(f"{type(err).__name__}: {err}")
                actions = ()
            for action in actions:
                if isinstance(action, Migrate):
                    self._order(action)  # the source slots free up when the pipeline reports it done
                    continue
                ps = self.pipes.get(action.pipeline)
                if ps is None or ps.requested != (action.step, action.stage):
                    continue
                # the stage runs where the pipeline's workers are, at the share the policy gave it
                if not self._fits(ps.spec.name, ps.home, action.sm_share):
                    continue
                alone = all(not self.leases[g] for g in ps.home)
                grants.append(self._grant(ps, ps.home, 1.0 if alone else action.sm_share, now, forced=False))
        if not grants and not any(ps.running for ps in self.pipes.values()):
            waiting = sorted((ps for ps in self.pipes.values() if ps.requested), key=lambda p: p.requested_s)
            for ps in waiting[:1]:
                if set(ps.home) <= set(self.free_slots()):
                    grants.append(self._grant(ps, ps.home, 1.0, now, forced=True))
        return grants

    def _fits(self, pipeline: str, gpus: tuple[int, ...], sm_share: float) -> bool:
        """Free slots, or (a share below 1, as the policy co-locates) slots each held by one other pipeline's
        lease, which then shrinks to the rest."""
        for g in gpus:
            held = self.leases[g] if 0 <= g < self.num_slots else None
            if held is None:
                return False
            if held and (sm_share >= 1.0 or len(held) > 1 or held[0].pipeline == pipeline):
                return False
        return True

    def _grant(self, ps: _Pipe, gpus: tuple[int, ...], share: float, now: float, *, forced: bool) -> Grant:
        step, stage = ps.requested
        grant = Grant(ps.spec.name, step, stage, gpus, share, forced, now)
        ps.requested = None
        ps.running[(step, stage)] = grant
        closed = []
        for g in gpus:
            if self.leases[g] and share < 1.0:  # the occupant's lease shrinks to the rest
                occupant = self.leases[g][0]
                if occupant.share > 1.0 - share:
                    closed.append((g, self._reshare(occupant, 1.0 - share, now)))
            self.leases[g].append(_Held(ps.spec.name, step, stage, share, now, forced))
            self.last[g] = ps.spec.name
        self._record(closed, now)
        return grant
