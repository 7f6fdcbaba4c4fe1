"""The live executor: runs a scheduling policy over pipelines that really run, by granting leases.

The simulator (:mod:`jigsaw_verl.sim.simulator`) is one clock over the pool mechanism (:mod:`jigsaw_verl.pool`);
this is the other. Each joined pipeline asks for its next stage (``request``) and blocks until it is granted; it
reports when the stage ends (``finish``). At every change the executor builds the policy's
:class:`~jigsaw_verl.policy.interface.Snapshot` with the pool's one builder, calls the policy's ``schedule`` and
applies the :class:`~jigsaw_verl.policy.interface.StartStage` actions for requested stages through the pool's slot
holds: a refusal means the stage waits. The policy is built by the factory the executor is given (over a
:class:`~jigsaw_verl.model.spec.WorkloadSpec` of the pipelines joined so far, rebuilt when one joins or leaves);
it learns the real stage times from the snapshot's ``history``.

What differs from the simulator, and why:
- A verl pipeline's worker groups are placed once, when it starts: rank ``r`` in the pool's slot ``home[r]`` (its
  *home*, a contiguous run of slots the executor picks at join by the pool's rule,
  :func:`~jigsaw_verl.model.topology.pick_home`: spread over the pool, each rollout replica on one node). A node that
  dies (``lose_node``) takes the pipelines living on it out of the group; the others go on. Every stage of
  it runs there, so the policy decides *when* a stage runs and whether it shares its slots (``sm_share``); a grant
  is always on the pipeline's home, and waits while the home cannot take it.
- Memory: what each slot holds is what the pipelines there have resident (:func:`stage_resident_bytes` of every
  lease, plus the training state of a pipeline that keeps it on its devices between leases, ``offload=False``);
  the snapshot's ``free_bytes`` say so, and a co-located grant that would not fit waits.
- A running rollout's replicas are what its pipeline reports (``report_replicas``). They become the snapshot's
  :class:`~jigsaw_verl.policy.interface.ReplicaView` s, so a ``Migrate`` becomes a :class:`MigrationOrder` the
  pipeline runs through its migrator; the source slots stay leased until it says the migration is done
  (``migrated``), then the rollout's lease shrinks to the targets. Replica ``r`` runs on home slots ``r * tp`` to
  ``(r + 1) * tp - 1`` (verl's rollout replicas over its worker ranks).
- Engines awake only inside leases: a pipeline's rollout engines hold their memory from its weight sync until its
  rollout ends, so the sync of step ``k`` *hands its lease over* to the rollout of step ``k + 1`` (``handover``: the
  same slots at the same share, in one call, without the policy). Its first sync (step -1), its start-up
  (:data:`~jigsaw_verl.model.graph.INIT`) and each validation (:data:`~jigsaw_verl.model.graph.VALIDATE`, with its
  own sync) are leases outside the step graph: granted on the pipeline's whole home when no other lease holds any
  of it, and nothing is granted beside them (two engines never start or profile memory on one slot at once). They
  are not stage times the predictor learns from. Start-up and validation are granted without the policy; the
  first sync is the head of the first rollout (it hands over to it), so it is granted when the policy starts that
  rollout (``verl-seq`` holds a second job's first sync until the first job is done). A sync after the last step
  (verl's own trainer makes one) is granted without the policy too.
- If nothing runs, every pipeline has asked for its next stage and the policy defers them all, the oldest request
  is granted on the pipeline's home (``Grant.forced``) so the pool never deadlocks (no grant is forced while a
  pipeline is between two stages: its next request may be what the policy waits for, as ``verl-seq`` waits for
  its running job); a policy that raises is logged (``policy_errors``) and treated the same way.

No Ray, verl or torch here: tests drive it directly, and :mod:`.scheduler` wraps it in a Ray actor.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from jigsaw_verl.model.catalogue import GPUSpec
from jigsaw_verl.model.engine_memory import EngineReservation
from jigsaw_verl.model.footprint import stage_resident_bytes
from jigsaw_verl.model.graph import OUTSIDE_STAGES, ROLLOUT, STAGES, UPDATE, WEIGHT_SYNC
from jigsaw_verl.model.spec import ClusterSpec, PipelineSpec, WorkloadSpec
from jigsaw_verl.model.topology import PoolTopology, home_runs, pick_home, placement_refusal
from jigsaw_verl.policy.interface import Migrate, Policy, ReadyStage, Snapshot, StartStage, features_of
from jigsaw_verl.pool.holds import Hold, Refusal, Segment, SlotHolds
from jigsaw_verl.pool.homes import sharing_refusal
from jigsaw_verl.pool.progress import PipelineProgress
from jigsaw_verl.pool.snapshot import ExecutorView, build_snapshot
from jigsaw_verl.pool.timeline import Slice
from jigsaw_verl.runtime.leases import (
    EngineMemoryRefused,
    Grant,
    MigrationOrder,
    PolicyRefused,
    PoolTooSmall,
    ReplicaReport,
    lease_slices,
)
from jigsaw_verl.runtime.live_view import (
    REPLICA_ID_STRIDE,
    LivePipe,
    engine_reservation_bytes,
    replica_slots,
    replica_views,
    slot_free_bytes,
)

logger = logging.getLogger(__name__)
# the first weight sync, outside the step graph, and the rollout it hands over to
FIRST_SYNC, FIRST_ROLLOUT = (-1, WEIGHT_SYNC), (0, ROLLOUT)

__all__ = [
    "EngineMemoryRefused",
    "Grant",
    "LiveExecutor",
    "MigrationOrder",
    "PolicyRefused",
    "PoolTooSmall",
    "ReplicaReport",
]


class LiveExecutor:
    """Runs a policy over the pipelines that join a pool of ``num_slots`` slots.

    Args:
        num_slots: slots (GPUs, or CPU slots on the CPU backend) in the pool.
        gpu: the slot's hardware figures for the policy's cost model and memory (its predictor corrects times).
        policy_factory: builds the policy over the pipelines joined so far (one configuration).
        policy_name: the policy's name, for messages.
        topology: the pool's nodes (``None``: one node of ``num_slots``); homes keep rollout replicas on one node.
    """

    def __init__(
        self,
        num_slots: int,
        gpu: GPUSpec,
        policy_factory: Callable[[WorkloadSpec], Policy],
        *,
        policy_name: str,
        topology: PoolTopology | None = None,
    ):
        if num_slots < 1:
            raise ValueError(f"the pool needs at least one slot, got {num_slots}")
        self.topology = topology or PoolTopology(num_slots, num_slots)
        if self.topology.num_slots != num_slots:
            raise ValueError(f"a pool of {num_slots} slots cannot have the shape {self.topology.describe()}")
        self.num_slots, self.gpu = num_slots, gpu
        self.policy_factory, self.policy_name = policy_factory, policy_name
        self.pipes: dict[str, LivePipe] = {}
        self.holds = SlotHolds(num_slots, self.topology.slots_per_node)
        self.planned_homes: dict[str, tuple[int, ...]] = {}
        self.history: list = []
        self.slices: list[Slice] = []
        self.left: dict[str, str] = {}
        self.left_steps: dict[str, int] = {}
        self._policy: Policy | None = None
        self._next_index = 0
        self.policy_errors: list[str] = []

    # ---- membership ------------------------------------------------------------------------------------------
    def join(
        self,
        spec: PipelineSpec,
        slots: int,
        now: float,
        *,
        offload: bool = True,
        engine: EngineReservation | None = None,
    ) -> None:
        """Add a pipeline that runs its stages on ``slots`` slots; ``offload``: it moves its training state off
        the devices between leases (else that state stays resident on its home); ``engine``: what its rollout
        engine reserves and what it pins on each home slot, refused (:class:`EngineMemoryRefused`) when it does not
        fit beside the engines of the pipelines already living there."""
        if spec.name in self.pipes:
            raise ValueError(f"pipeline {spec.name!r} already joined this group")
        if slots > self.num_slots:
            raise PoolTooSmall(f"pipeline {spec.name!r} needs {slots} slots but the group's pool has {self.num_slots}")
        home = self._pick_home(spec, slots)
        refusal = self._engine_refusal(home, engine) if engine is not None else None
        if refusal:
            raise EngineMemoryRefused(f"pipeline {spec.name!r} cannot join: {refusal}")
        progress = PipelineProgress(name=spec.name, index=self._next_index, steps=spec.steps, arrival_s=now)
        progress.arrived = True
        self.pipes[spec.name] = LivePipe(spec=spec, progress=progress, home=home, offload=offload, engine=engine)
        self._policy = None
        try:
            self._check_modes(self.policy())
        except Exception:
            del self.pipes[spec.name]
            self._policy = None
            raise
        self._next_index += 1

    def _check_modes(self, policy: Policy) -> None:
        """The live runtime runs on-policy synchronous steps only (verl's sync trainer), on replicas of the one
        tensor-parallel size verl builds them at (a tail move to a wider replica is simulation only)."""
        for name, ps in self.pipes.items():
            if (ps.spec.rollout_elastic_tp or 0) > ps.spec.rollout_tp:
                raise PolicyRefused(
                    f"pipeline {name!r} sets rollout_elastic_tp={ps.spec.rollout_elastic_tp}: verl 0.9.1 builds "
                    f"its rollout replicas at one tensor-parallel size; leave it unset to run live"
                )
            needs = features_of(policy.mode(name))
            if needs:
                raise PolicyRefused(
                    f"jigsaw.mux.policy={self.policy_name!r} would run pipeline {name!r} with "
                    f"{', '.join(sorted(needs))}; the live runtime runs on-policy synchronous steps only"
                )

    def home(self, pipeline: str) -> tuple[int, ...]:
        """The slots a pipeline's workers are placed on (rank ``r`` on ``home[r]``)."""
        return self._pipe(pipeline).home

    def _pick_home(self, spec: PipelineSpec, slots: int) -> tuple[int, ...]:
        """The pool's home rule (:func:`~jigsaw_verl.model.topology.pick_home`): a run of ``slots`` slots whose
        rollout replicas stay on one node, the fewest joined pipelines live on, on no lost node."""
        tp = spec.rollout_tp
        planned = self.planned_homes.get(spec.name)
        if planned is not None and planned in home_runs(slots, tp, self.topology, self.holds.lost):
            return planned
        home = pick_home([ps.home for ps in self.pipes.values()], slots, tp, self.topology, self.holds.lost)
        if home is None:
            why = placement_refusal(slots, tp, self.topology) or f"slots {sorted(self.holds.lost)} are on lost nodes"
            raise PoolTooSmall(f"pipeline {spec.name!r} (rollout TP {tp}) has no home of {slots} slots: {why}")
        return home

    def plan_homes(self, homes: dict[str, tuple[int, ...]]) -> None:
        """Where the named pipelines live when they join (placed beforehand by the pool rule, in the order the
        launcher checked them), whatever order they join in; a home that no longer fits is picked anew."""
        self.planned_homes.update({name: tuple(home) for name, home in homes.items()})

    def lose_node(self, node: int, now: float) -> list[Grant]:
        """Node ``node`` left the pool (its Ray node died): every pipeline living on it leaves (its workers are
        gone), its slots are never handed out again; returns the grants this makes for the others."""
        slots = set(self.topology.node_slots(node))
        self.holds.lose(slots)
        grants: list[Grant] = []
        for name in [n for n, ps in self.pipes.items() if slots & set(ps.home)]:
            grants += self.leave(name, now, reason=f"node {node} lost")
        return grants

    def _engine_refusal(self, home: tuple[int, ...], engine: EngineReservation) -> str | None:
        """The slot memory rule over the pipelines already living on ``home`` plus the newcomer's ``engine``."""
        placed: dict[tuple[int, ...], list[EngineReservation]] = {}
        for ps in self.pipes.values():  # in join order, the newcomer last
            if ps.engine is not None and set(ps.home) & set(home):
                placed.setdefault(ps.home, []).append(ps.engine)
        placed.setdefault(home, []).append(engine)
        return sharing_refusal(placed, self.gpu.memory_bytes)

    def leave(self, pipeline: str, now: float, reason: str = "finished") -> list[Grant]:
        """Remove a pipeline (finished, or crashed: its leases are reclaimed); returns new grants for others."""
        ps = self.pipes.pop(pipeline, None)
        if ps is None:
            return []
        for key in list(ps.running):
            self._end(ps, key, now, record=False)
        self.left[pipeline] = reason
        self.left_steps[pipeline] = ps.progress.steps_done
        self._policy = None
        return self.decide(now)

    # ---- stage events ----------------------------------------------------------------------------------------
    def request(self, pipeline: str, step: int, stage: str, now: float) -> list[Grant]:
        """``pipeline`` waits to start ``stage`` of ``step``; returns the grants this decision made."""
        ps = self._pipe(pipeline)
        if stage not in STAGES + OUTSIDE_STAGES:
            raise ValueError(f"unknown stage {stage!r} (stages: {', '.join(STAGES + OUTSIDE_STAGES)})")
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

    def handover(
        self, pipeline: str, step: int, stage: str, next_step: int, next_stage: str, now: float
    ) -> list[Grant]:
        """``pipeline`` ends ``stage`` of ``step`` and starts ``next_stage`` of ``next_step`` on the same slots at the
        same share at once, without the policy: its rollout engines are awake across the two (a weight sync, start-up
        or validation followed by a rollout). Returns the grants this made (the handover's first)."""
        ps = self._pipe(pipeline)
        if (step, stage) not in ps.running:
            raise ValueError(f"{pipeline} hands over {stage} of step {step}, which was not granted")
        if ps.requested is not None:
            raise ValueError(f"{pipeline} already waits for {ps.requested}; one request at a time")
        share = ps.running[(step, stage)].sm_share
        self._end(ps, (step, stage), now, record=True)
        ps.requested, ps.requested_s = (next_step, next_stage), now
        return self._try_grant(ps, share, now, forced=False, admit=False) + self.decide(now)

    def _end(
        self, ps: LivePipe, key: tuple[int, str], now: float, *, record: bool, finish_offsets_s: tuple = ()
    ) -> None:
        grant = ps.running.pop(key)
        if key[1] == ROLLOUT:
            ps.replicas, ps.migrating, ps.gone, ps.orders = {}, set(), set(), []
        self.slices += lease_slices(self.holds.release(ps.holds.pop(key), now), now)
        if not record or not _in_graph(*key):
            return
        self.history.append(ps.progress.end(*key, now, finish_offsets_s))
        if key[1] == UPDATE:
            ps.train_gpus = grant.gpus

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
        slots = replica_slots(ps, grant)
        freed = tuple(sorted(g for r in sources for g in slots.get(r, ())))
        ps.migrating -= set(sources)
        ps.gone |= set(sources)
        for r in sources:
            ps.replicas.pop(r, None)
        if not freed or len(freed) >= len(grant.gpus):
            return []
        self.slices += lease_slices(self.holds.release(ps.holds[key], now, freed), now)
        ps.running[key] = replace(grant, gpus=tuple(g for g in grant.gpus if g not in freed))
        return self.decide(now)

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

    def _pipe(self, pipeline: str) -> LivePipe:
        if pipeline not in self.pipes:
            raise KeyError(f"pipeline {pipeline!r} has not joined this group (joined: {sorted(self.pipes)})")
        return self.pipes[pipeline]

    def open_slices(self, now: float) -> list[Slice]:
        """The holds running now, as slices up to ``now``."""
        segments = [Segment(g, h, h.shares[g], h.since[g]) for h in self.holds.holds() for g in h.slots]
        return lease_slices(segments, now)

    def free_slots(self) -> list[int]:
        return self.holds.free_slots()

    # ---- what the policy sees --------------------------------------------------------------------------------
    def policy(self) -> Policy | None:
        """The policy over the pipelines joined now (built once per membership change)."""
        if self._policy is None and self.pipes:
            workload = WorkloadSpec(
                name="live",
                seed=0,
                cluster=ClusterSpec(gpu=self.gpu, num_gpus=self.num_slots, gpus_per_node=self.topology.slots_per_node),
                pipelines=tuple(p.spec for p in self._ordered()),
            )
            self._policy = self.policy_factory(workload)
        return self._policy

    def _ordered(self) -> list[LivePipe]:
        """The pipelines in pool order (by home, then by joining): the order the policy's workload lists them in, so
        a static split's equal slices are the homes whatever order the pipelines joined in."""
        return sorted(self.pipes.values(), key=lambda p: (p.home, p.index))

    def snapshot(self, now: float) -> Snapshot:
        """What the policy sees now, from the pool's one snapshot builder."""
        pipes = self._ordered()
        return build_snapshot(now_s=now, holds=self.holds, pipelines=[p.progress for p in pipes], view=self.view())

    def view(self) -> ExecutorView:
        """What only the live executor knows: the requested stages, the reported replicas, resident memory."""
        pipes = self._ordered()
        ready = tuple(
            ReadyStage(ps.spec.name, *self._planned_as(ps.requested))
            for ps in pipes
            if ps.requested is not None and not self._bypass(ps, *ps.requested)
        )
        replicas, replica_of = replica_views(pipes)
        return ExecutorView(
            ready=ready,
            replicas=replicas,
            replica_of=replica_of,
            free_bytes=self.free_bytes(),
            train_slots={ps.spec.name: ps.train_gpus for ps in pipes if ps.train_gpus},
            history=tuple(self.history),
        )

    def free_bytes(self) -> tuple[float, ...]:
        """Per slot, device memory nothing running holds, bytes (:func:`~.live_view.slot_free_bytes`)."""
        return slot_free_bytes(self.pipes.values(), self.gpu, self.num_slots)

    def _bypass(self, ps: LivePipe, step: int, stage: str) -> bool:
        """Granted without the policy: leases outside the step graph but the first sync, and a sync after the last
        step (verl's trainer makes one; nothing rolls out after it)."""
        if (step, stage) == FIRST_SYNC:
            return False
        return not _in_graph(step, stage) or (stage == WEIGHT_SYNC and step >= ps.spec.steps - 1)

    @staticmethod
    def _planned_as(requested: tuple[int, str]) -> tuple[int, str]:
        """The stage the policy plans for a request: the first sync as the first rollout it hands over to."""
        return FIRST_ROLLOUT if requested == FIRST_SYNC else requested

    # ---- deciding --------------------------------------------------------------------------------------------
    def decide(self, now: float) -> list[Grant]:
        """Ask the policy what starts now; grant the requested stages it starts."""
        grants: list[Grant] = []
        for ps in list(self.pipes.values()):
            if ps.requested is not None and self._bypass(ps, *ps.requested):
                grants += self._try_grant(ps, 1.0, now, forced=True)  # else it waits for its home, like any stage
        if any(ps.requested is not None for ps in self.pipes.values()):
            for action in self._plan(now):
                if isinstance(action, Migrate):
                    self._order(action)  # the source slots free up when the pipeline reports it done
                    continue
                if not isinstance(action, StartStage):  # refused at join (_check_modes): never planned live
                    self.policy_errors.append(f"{self.policy_name}: {action} cannot run live; ignored")
                    continue
                ps = self.pipes.get(action.pipeline)
                if ps is None or ps.requested is None or self._planned_as(ps.requested) != (action.step, action.stage):
                    continue
                # the stage runs where the pipeline's workers are, at the share the policy gave it (the first sync
                # alone on them: it wakes the engines)
                share = 1.0 if ps.requested == FIRST_SYNC else action.sm_share
                grants += self._try_grant(ps, share, now, forced=False)
        # the pool would deadlock only when nothing runs and every pipeline waits on the policy: one between two
        # stages (its next request on the way) may be what the policy waits for (verl-seq's running job)
        pipes = self.pipes.values()
        if not grants and not any(ps.running for ps in pipes) and all(ps.requested for ps in pipes):
            waiting = sorted(pipes, key=lambda p: p.requested_s)
            for ps in waiting[:1]:
                grants += self._try_grant(ps, 1.0, now, forced=True)
        return grants

    def _plan(self, now: float) -> tuple:
        try:
            return self.policy().schedule(self.snapshot(now)).actions
        except Exception as err:  # a policy bug must not stall every pipeline: grant in arrival order
            logger.exception("policy %s failed; granting in arrival order", self.policy_name)
            self.policy_errors.append(f"{type(err).__name__}: {err}")
            return ()

    def _try_grant(self, ps: LivePipe, share: float, now: float, *, forced: bool, admit: bool = True) -> list[Grant]:
        """Grant ``ps``'s requested stage on its home through the pool's holds (alone: the whole slots; beside one
        other pipeline's lease: at ``share``, if its memory fits there too); nothing when the pool refuses.
        ``admit``: apply the admission rules (off for a handover, whose memory is resident already)."""
        step, stage = ps.requested
        alone = all(not self.holds.on(g) for g in ps.home)
        share = 1.0 if alone else share
        if not alone and admit and not self._may_share(ps, stage):
            return []
        hold = Hold(ps.spec.name, step, stage, forced=forced)
        claimed = self.holds.claim(hold, ps.home, share, now)
        if isinstance(claimed, Refusal):
            return []
        self.slices += lease_slices(claimed, now)
        grant = Grant(ps.spec.name, step, stage, ps.home, share, forced, now)
        ps.requested = None
        ps.running[(step, stage)] = grant
        ps.holds[(step, stage)] = hold
        if _in_graph(step, stage):
            ps.progress.start(step, stage, now, len(ps.home))
        return [grant]

    def _may_share(self, ps: LivePipe, stage: str) -> bool:
        """Whether ``ps``'s ``stage`` may run beside the other pipelines' leases on its home: never a lease outside
        the graph, nor beside one; a weight sync not beside a rollout (it hands over to its own rollout, and two
        rollouts never share a slot); else when its memory fits (:meth:`_fits_beside`)."""
        beside = {h.stage for g in ps.home for h in self.holds.on(g)}
        if stage in OUTSIDE_STAGES or beside & set(OUTSIDE_STAGES) or (stage == WEIGHT_SYNC and ROLLOUT in beside):
            return False
        return self._fits_beside(ps, stage)

    def _fits_beside(self, ps: LivePipe, stage: str) -> bool:
        """Memory admission of a co-located grant: the stage's footprint fits what its home slots have free."""
        need = stage_resident_bytes(ps.spec, stage, len(ps.home))
        if stage != ROLLOUT and not ps.offload:
            need = 0.0  # its training state is resident there already
        reserved = engine_reservation_bytes(ps, stage, self.gpu)  # as free_bytes counts it
        if reserved:
            need = (need if stage != ROLLOUT else 0.0) + reserved
        free = self.free_bytes()
        return all(free[g] >= need for g in ps.home)


def _in_graph(step: int, stage: str) -> bool:
    """Whether ``stage`` of ``step`` is a node of the pipeline's step graph (what the policy plans and the predictor
    learns from), not a lease outside it (start-up, validation, the first sync)."""
    return step >= 0 and stage in STAGES
