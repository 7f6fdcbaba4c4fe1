"""The JigsawRL scheduler: ``greedy`` and the look-ahead ``jigsaw`` policy.

One idea explains every case of :meth:`LookAheadPolicy.schedule`: build a few candidate action sets (start the
ready sub-stages first-fit, defer one, split the free GPUs differently, merge a rollout's tail to free GPUs
first, co-locate or not), roll each forward over the pipelines' predicted graphs for ``horizon`` more stages per
pipeline, and take the set whose predicted completions, weighted per pipeline, are smallest. With ``horizon`` 0
there is nothing to roll forward and the first candidate, the greedy one, is taken: that is ``greedy``.

The roll-forward is a list schedule on predicted durations (:class:`~jigsaw_verl.policy.jigsaw.predictor.Predictor`):
each GPU becomes free when its leases are predicted to end; each pipeline's next stages start, in step order,
as soon as enough GPUs are free, on the width the prediction says finishes first. It is coarse on purpose: a
decision must take milliseconds at 1024 GPUs x 64 pipelines. Both place stages by the rules of one
:class:`~jigsaw_verl.policy.jigsaw.planning.PlanningModel`.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from jigsaw_verl.model.cost_model import CostModel
from jigsaw_verl.model.graph import LOGPROB, ROLLOUT, UPDATE, WEIGHT_SYNC
from jigsaw_verl.model.spec import PipelineSpec, WorkloadSpec
from jigsaw_verl.model.topology import topology_of, whole_replicas
from jigsaw_verl.policy.interface import ExecutionMode, ReadyStage, SchedulerOutput, Snapshot, StartStage
from jigsaw_verl.policy.jigsaw.knobs import JigsawKnobs
from jigsaw_verl.policy.jigsaw.planning import PlanningModel, fair_share
from jigsaw_verl.policy.jigsaw.rollforward import RollForward, widening_due


def _mode(spec: PipelineSpec) -> ExecutionMode:
    """A sync pipeline runs on-policy, stage by stage, as the live runtime runs it: verl's synchronous trainer with
    its hybrid engine, whose weight sync reshards in place and wakes the slept engine every step (``colocated``:
    the switch is charged, as verl's own is). An async one uses the staleness it declares as AReaL does: step k's
    rollout may start while step k - 1 still generates, once version k - ``max_staleness`` exists (the mode lets it
    join those replicas; this policy starts each step on free GPUs of its own, see
    :meth:`~jigsaw_verl.policy.jigsaw.planning.PlanningModel.rollout_cap`), new weights interrupt live requests,
    which re-prefill and go on, and the sync broadcasts to the rollout replicas."""
    if spec.mode != "async":
        return ExecutionMode(staleness=0, colocated=True)
    return ExecutionMode(staleness=spec.max_staleness, overlap_rollouts=True, interrupt_on_update=True, colocated=False)


class _FirstFit:
    """What one first-fit pass has handed out so far.

    Attributes:
        free: GPUs still free.
        taken: GPUs this plan starts something on (or that a merge in it releases).
        started: GPUs this plan starts something on.
        actions: the starts, in order.
        blocked: GPUs a newcomer may not join (free or taken), once a co-location asked for it.
        gangs: per GPU, a training gang this plan starts alone on it (free before): its pipeline and the bytes it
            takes there. A rollout may join it in the same plan, as it would in the decision right after (the
            executors apply a plan's starts in order, so the gang's lease exists when the rollout asks).
    """

    def __init__(self, free: set[int], taken: set[int]):
        self.free, self.taken = free, taken
        self.started: set[int] = set()
        self.actions: list[StartStage] = []
        self.blocked: np.ndarray | None = None
        self.gangs: dict[int, tuple[str, float]] = {}

    def blocked_mask(self, num_gpus: int) -> np.ndarray:
        if self.blocked is None:
            self.blocked = np.zeros(num_gpus, dtype=bool)
            self.blocked[list(self.free | self.taken)] = True
            self.blocked[list(self.gangs)] = False
        return self.blocked

    def take(self, start: StartStage, gang_bytes: float | None = None) -> None:
        """Record ``start``; ``gang_bytes``: it is a training gang on free GPUs that a rollout may join."""
        self.actions.append(start)
        joined = set(start.gpus) - self.free
        for g in joined:
            self.gangs.pop(g, None)
        if gang_bytes is not None and not joined:
            self.gangs.update(dict.fromkeys(start.gpus, (start.pipeline, gang_bytes)))
        self.free -= set(start.gpus)
        self.taken |= set(start.gpus)
        self.started |= set(start.gpus)
        if self.blocked is not None:
            self.blocked[list(start.gpus)] = True
            self.blocked[list(self.gangs)] = False


class LookAheadPolicy:
    """The JigsawRL scheduler over one workload.

    Args:
        workload: the pool and pipelines.
        knobs: the scheduler's knobs.
        name: registry name (``jigsaw``, ``greedy`` or an ablation's).
        cost: cost model (the workload GPU's by default).
    """

    detailed_snapshot = True

    def __init__(self, workload: WorkloadSpec, knobs: JigsawKnobs, *, name: str, cost: CostModel | None = None):
        self.name, self.knobs = name, knobs
        self.config = (
            f"horizon {knobs.horizon}, {knobs.max_candidates} candidates, "
            f"migration {'on' if knobs.migration else 'off'}, co-location {'on' if knobs.colocation else 'off'}"
        )
        if knobs.wide_start:
            self.config += ", wide start"
        if any((p.rollout_elastic_tp or 0) > p.rollout_tp for p in workload.pipelines):
            self.config += f", elastic tail {'on' if knobs.elastic_tail and knobs.horizon else 'off'}"
        self.modes = {p.name: _mode(p) for p in workload.pipelines}
        hybrid = frozenset(name for name, mode in self.modes.items() if mode.colocated)
        self.planning = PlanningModel(workload, knobs, cost, hybrid_sync=hybrid)
        self._elastic = frozenset(p.name for p in workload.pipelines if (p.rollout_elastic_tp or 0) > p.rollout_tp)
        # NOTE: with nothing ready the decision is empty unless a tail may move onto a wider replica (schedule)
        self.acts_only_on_ready = knobs.horizon == 0 or not (knobs.elastic_tail and self._elastic)
        self._leases: tuple | None = None  # the last snapshot's per-GPU lease arrays (see _lease_arrays)
        self._bytes: dict[tuple[str, str, int], float] = {}  # ResourceManager.stage_bytes, memoised

    def mode(self, pipeline: str) -> ExecutionMode:
        return self.modes[pipeline]

    # ---- the decision ------------------------------------------------------------------------------------------
    def schedule(self, snap: Snapshot) -> SchedulerOutput:
        """Candidates first (the greedy one first, so ties and ``horizon`` 0 keep it), then the best score."""
        greedy = self._fill(snap, set(snap.free_gpus), list(snap.ready))
        if self.knobs.horizon == 0 or not (snap.ready or self._may_widen(snap)):
            return SchedulerOutput(greedy)
        ctx = RollForward(self.planning, snap)
        # NOTE: candidates x pipelines x horizon bounds the work of a decision; at scale fewer candidates are scored
        # (and only as many are built).
        budget = 4 * self.knobs.placement_budget // max(1, ctx.active * ctx.horizon)
        limit = min(self.knobs.max_candidates, max(2, budget))
        seen, unique = {greedy}, [greedy]
        for c in self._alternatives(snap, ctx):
            if len(unique) >= limit:
                break
            if c not in seen:
                seen.add(c)
                unique.append(c)
        if len(unique) == 1:
            return SchedulerOutput(greedy)
        scores = [ctx.score(c) for c in unique]
        best = min(range(len(unique)), key=lambda i: (scores[i], i))
        # NOTE: predictions are coarse; leave the greedy plan only for a clear predicted gain.
        if scores[best] > scores[0] * (1.0 - self.knobs.min_gain):
            return SchedulerOutput(greedy)
        return SchedulerOutput(unique[best])

    def _alternatives(self, snap: Snapshot, ctx: RollForward) -> Iterator[tuple]:
        """The other candidates, in order, built as they are asked for."""
        free, ready = set(snap.free_gpus), list(snap.ready)
        busy = len(free) < snap.num_gpus
        if busy:  # something will end and call us again: waiting is an option
            for r in ready:  # stages bound to their training GPUs never wait by choice
                if r.stage in self.knobs.deferrable:
                    yield self._fill(snap, free, [x for x in ready if x != r])
        if len(ready) > 1:
            yield self._fill(snap, free, ready[::-1])
        for r in ready if self.knobs.wide_start else ():
            if r.stage == ROLLOUT:  # the whole free pool rather than a fair share
                yield self._fill(snap, free, ready, caps={r: len(free)})
        if self.knobs.colocation:
            yield self._fill(snap, free, ready, colocate=False)
        for wide in ctx.widenings.values():
            rest = [r for r in ready if r.pipeline != wide.action.pipeline]
            freed = set(wide.freed_gpus)
            yield (wide.action, *self._fill(snap, (free - set(wide.taken_gpus)) | freed, rest, released=freed))
        if self.knobs.migration:
            for plan in ctx.migrations.values():
                rest = [r for r in ready if r.pipeline != plan.action.pipeline]
                starts = self._fill(snap, free | set(plan.freed_gpus), rest, released=set(plan.freed_gpus))
                if any(set(a.gpus) & set(plan.freed_gpus) for a in starts):  # only when a ready stage takes them
                    yield (plan.action, *starts)

    def _may_widen(self, snap: Snapshot) -> bool:
        """Whether some pipeline's running rollout is in a tail a wider replica may take (cheap: nothing is rolled
        forward for the decisions that only see a request finish)."""
        if not self.knobs.elastic_tail or not self._elastic:
            return False
        reps: dict[str, list] = {}
        for r in snap.replicas:
            if r.pipeline in self._elastic:
                reps.setdefault(r.pipeline, []).append(r)
        m = self.planning
        return any(
            widening_due(m.specs[name], rs, True, self.knobs.widen_live_per_replica)
            and not any(len(snap.leases[g]) > 1 for r in rs for g in r.gpus)
            for name, rs in reps.items()
        )

    # ---- first-fit with co-location ------------------------------------------------------------------------------
    def _fill(
        self,
        snap: Snapshot,
        free: set[int],
        ready: list[ReadyStage],
        *,
        caps: dict | None = None,
        colocate: bool | None = None,
        released: set[int] | None = None,
    ) -> tuple:
        """Start ``ready`` in order on ``free`` GPUs: each takes what it can use; a stage short of GPUs joins
        long-tail replicas (training) or gangs (rollout) of other pipelines when memory allows (``colocate``
        only changes where new stages go: an update or sync joins its training GPUs whenever co-location is on)."""
        colocate = self.knobs.colocation if colocate is None else colocate
        plan = _FirstFit(set(free), set(released or ()))
        views = {v.name: v for v in snap.pipelines}
        fair = fair_share(snap)
        # NOTE: stages bound to the GPUs holding their training state go first, so a rollout never takes them.
        training: set[str] = set()  # NOTE: a pipeline's training side runs one stage at a time
        for r in sorted(ready, key=lambda r: r.stage not in (UPDATE, WEIGHT_SYNC)):
            if r.stage != ROLLOUT:
                if r.pipeline in training:
                    continue
                training.add(r.pipeline)
            home = views[r.pipeline].train_gpus
            if r.stage in (UPDATE, WEIGHT_SYNC) and home:
                start = self._start_at_home(snap, r, home, plan)
            else:
                start = self._start_first_fit(snap, r, plan, caps=caps, colocate=colocate, fair=fair)
            if start is not None:
                gang = start.stage in (LOGPROB, UPDATE) and start.sm_share == 1.0
                plan.take(start, self._stage_bytes(r.pipeline, r.stage, len(start.gpus)) if gang else None)
        return tuple(plan.actions)

    def _start_at_home(
        self, snap: Snapshot, r: ReadyStage, home: tuple[int, ...], plan: _FirstFit
    ) -> StartStage | None:
        """An update or sync on the GPUs holding its training state: it waits for them rather than re-shard from
        host; an update joins the long-tail replicas on them when co-location is on (not where this plan already
        starts something: the snapshot's leases do not show those). A sync never does: the live executor grants
        no weight sync beside a rollout (:meth:`~jigsaw_verl.runtime.executor.LiveExecutor._may_share`)."""
        busy = [g for g in home if g not in plan.free]
        if plan.started.intersection(busy):
            return None
        if not busy:
            return StartStage(r.pipeline, r.step, r.stage, tuple(home))
        if r.stage == WEIGHT_SYNC:  # it wakes the engines: never beside another pipeline's rollout (as live)
            return None
        if self.knobs.colocation and self._joinable(snap, r.pipeline, LOGPROB, busy, len(home)) == busy:
            return StartStage(r.pipeline, r.step, r.stage, tuple(home), 1.0 - self.planning.tail_share)
        return None

    def _start_first_fit(
        self, snap: Snapshot, r: ReadyStage, plan: _FirstFit, *, caps: dict | None, colocate: bool, fair: int
    ) -> StartStage | None:
        """``r`` on the lowest free GPUs, as many as it can use (``caps`` overrides a rollout's fair share),
        joining other pipelines' GPUs when short or, for log-prob passes, when that pays."""
        m = self.planning
        capped = caps is not None and r in caps  # only the stage named loses its fair-share rules
        cap = caps[r] if capped else m.n
        if r.stage == ROLLOUT:
            unit = need = m.specs[r.pipeline].rollout_tp
            if not capped:
                cap = m.rollout_cap(r.pipeline, fair)
        else:
            unit, need = 1, m.rm.min_train[r.pipeline]
            if r.stage == WEIGHT_SYNC:
                cap = min(cap, need)
        # a rollout takes whole replicas, each on one node; other stages the lowest free GPUs
        free = whole_replicas(plan.free, unit, topology_of(snap)) if r.stage == ROLLOUT else sorted(plan.free)
        gpus = free[: max(need, min(cap, m.best_width(r.pipeline, r.stage, len(plan.free))))]
        gpus = gpus[: len(gpus) // unit * unit]
        share = 1.0
        if colocate and r.stage in (ROLLOUT, LOGPROB):
            # a log-prob on fewer than half a fair share would rather wait (below): short of GPUs, too
            short = max(need, fair // 2) if r.stage == LOGPROB and not capped else need
            gpus, share = self._join_others(snap, r, gpus, short, unit, plan)
        if len(gpus) < need:
            return None
        if r.stage == LOGPROB and not capped and len(gpus) < fair // 2 and len(plan.free) < snap.num_gpus:
            return None  # a training step on a sliver of the pool takes longer than waiting for more
        return StartStage(r.pipeline, r.step, r.stage, tuple(gpus), share)

    def _join_others(
        self, snap: Snapshot, r: ReadyStage, gpus: list[int], need: int, unit: int, plan: _FirstFit
    ) -> tuple[list[int], float]:
        """``gpus`` widened onto GPUs another pipeline holds alone, with the SM share ``r`` leases there, when
        ``r`` is short of GPUs (fewer than ``need``) or (an async pipeline's log-prob pass) the wider gang pays for
        its slowdown; else ``gpus``, 1."""
        m = self.planning
        joint = self._joinable(snap, r.pipeline, r.stage, None, max(need, len(gpus) + 1), plan)
        speed = m.train_speed if r.stage != ROLLOUT else 1.0
        # NOTE: a sync pipeline's log-prob widens onto tails only when short: its home grows onto them, and its
        # weight sync (which never joins a rollout) then waits for those tails to end
        wider = speed * (len(gpus) + len(joint)) > len(gpus) * 1.25
        gain = r.stage == LOGPROB and wider and not self.modes[r.pipeline].colocated
        if joint and (len(gpus) < need or gain):
            if r.stage == ROLLOUT:  # whole replicas of the rollout's TP size, each on one node
                cand = gpus + whole_replicas(joint, unit, topology_of(snap))
            else:
                cand = sorted(gpus + joint)
            if len(cand) >= need:
                return cand, m.tail_share if r.stage == ROLLOUT else 1.0 - m.tail_share
        return gpus, 1.0

    def _joinable(
        self, snap: Snapshot, pipeline: str, stage: str, candidates: list[int] | None, gpus: int, plan=None
    ) -> list[int]:
        """GPUs among ``candidates`` (every GPU the ``plan`` has not blocked when ``None``) held by exactly one lease
        of another pipeline, a long-tail replica (memory-bound) when the newcomer trains or a gang when it rolls
        out, with memory for the newcomer; the gangs ``plan`` itself starts count as leases. Vectorised over the
        snapshot's leases (read once per snapshot)."""
        single, pipe, roll, ok, free_bytes = self._lease_arrays(snap)
        need = self._stage_bytes(pipeline, stage, gpus)
        if plan is not None and plan.gangs:
            single, pipe, roll, ok, free_bytes = (x.copy() for x in (single, pipe, roll, ok, free_bytes))
            for g, (owner, used) in plan.gangs.items():
                single[g], pipe[g], roll[g], ok[g] = True, self.planning.index[owner], False, True
                free_bytes[g] -= used
        mask = single & (pipe != self.planning.index[pipeline]) & (roll != (stage == ROLLOUT)) & ok
        mask &= free_bytes >= need
        if candidates is None:
            return np.flatnonzero(mask & ~plan.blocked_mask(snap.num_gpus) if plan is not None else mask).tolist()
        return [g for g in candidates if mask[g]]

    def _stage_bytes(self, pipeline: str, stage: str, gpus: int) -> float:
        key = (pipeline, stage, gpus)
        if key not in self._bytes:
            self._bytes[key] = self.planning.rm.stage_bytes(*key)
        return self._bytes[key]

    def _lease_arrays(self, snap: Snapshot) -> tuple:
        """Per GPU: held by exactly one lease; its pipeline's index; whether it is a rollout replica; whether a
        newcomer may join it (a gang other than a weight sync, or a replica in its memory-bound tail); free bytes.
        Cached for the last snapshot (held, so its identity is not reused)."""
        if self._leases is not None and self._leases[0] is snap:
            return self._leases[1]
        n, tail_live, index = snap.num_gpus, self.knobs.colocate_live_per_replica, self.planning.index
        refilled = self.planning.refilled
        tail = {
            r.replica for r in snap.replicas if r.queued == 0 and r.live <= tail_live and r.pipeline not in refilled
        }
        single, pipe = np.zeros(n, dtype=bool), np.full(n, -1)
        roll, ok = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
        for g, leases in enumerate(snap.leases):
            if len(leases) == 1:
                lease = leases[0]
                single[g], pipe[g], roll[g] = True, index[lease.pipeline], lease.stage == ROLLOUT
                # NOTE: nothing joins a weight sync: it hands its slots over to its own rollout (as live)
                ok[g] = lease.stage != WEIGHT_SYNC and (lease.replica is None or lease.replica in tail)
        arrays = (single, pipe, roll, ok, np.asarray(snap.free_bytes, dtype=float))
        self._leases = (snap, arrays)
        return arrays
