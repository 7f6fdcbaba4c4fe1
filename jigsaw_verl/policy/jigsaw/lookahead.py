"""The JigsawRL scheduler: ``greedy`` and the look-ahead ``jigsaw`` policy.

One idea explains every case of :meth:`LookAheadPolicy.schedule`: build a few candidate action sets (start the
ready sub-stages first-fit, defer one, split the free GPUs differently, merge a rollout's tail to free GPUs
first, co-locate or not), roll each forward over the pipelines' predicted graphs for ``horizon`` more stages per
pipeline, and take the set whose predicted completions, weighted per pipeline, are smallest. With ``horizon`` 0
there is nothing to roll forward and the first candidate, the greedy one, is taken: that is ``greedy``.

The roll-forward is a list schedule on predicted durations (:class:`~jigsaw_verl.policy.jigsaw.predictor.Predictor`):
each GPU becomes free when its leases are predicted to end; each pipeline's next stages start, in step order,
as soon as enough GPUs are free, on the width the prediction says finishes first. It is coarse on purpose: a
decision must take milliseconds at 1024 GPUs x 64 pipelines.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from jigsaw_verl.model.cost_model import CostModel
from jigsaw_verl.model.graph import LOGPROB, ROLLOUT, STAGES, UPDATE, WEIGHT_SYNC
from jigsaw_verl.model.memory import min_train_gpus, usable_bytes
from jigsaw_verl.model.spec import WorkloadSpec
from jigsaw_verl.policy.interface import ExecutionMode, ReadyStage, SchedulerOutput, Snapshot, StartStage
from jigsaw_verl.policy.jigsaw.interference import InterferenceTable, ResourceManager
from jigsaw_verl.policy.jigsaw.predictor import Predictor, _interp
from jigsaw_verl.policy.jigsaw.rollforward import RollForward


@dataclass(frozen=True, kw_only=True)
class JigsawConfig:
    """Knobs of the scheduler (defaults chosen with ``scripts/bench_sim.py``).

    Attributes:
        horizon: stages per pipeline rolled forward when scoring a candidate; 0 is ``greedy``.
        max_candidates: candidate action sets scored per decision.
        placement_budget: stage placements one roll-forward may make; with many pipelines the horizon shrinks to
            ``placement_budget // pipelines`` (at least 1), and a decision scores at most ``4 * placement_budget``
            placements (at least 2 candidates), so it stays within milliseconds.
        migration: whether tails may be merged (k -> m replicas).
        colocation: whether two sub-stages may share a GPU with SM shares.
        tail_live_per_replica: a rollout is in its tail below this many live requests per replica.
        min_gain: relative predicted gain over the greedy plan an alternative needs to be taken.
        max_live_per_target: live requests a merge target may end up with.
        colocate_live_per_replica: a replica with at most this many live requests (and none queued) is in its
            memory-bound tail and may host a training stage.
        deferrable: stages a candidate may hold back to start them wider later.
        interference_file: a profiled interference table (JSON, see :mod:`.resources`); ``None`` derives it from
            the cost model.
    """

    horizon: int = 8
    max_candidates: int = 16
    placement_budget: int = 32
    migration: bool = True
    colocation: bool = True
    min_gain: float = 0.05
    tail_live_per_replica: float = 1.0
    colocate_live_per_replica: int = 32
    deferrable: tuple[str, ...] = (ROLLOUT,)
    max_live_per_target: int = 2
    interference_file: str | None = None


class LookAheadPolicy:
    """The JigsawRL scheduler over one workload.

    Args:
        workload: the pool and pipelines.
        config: the knobs.
        name: registry name (``jigsaw``, ``greedy`` or an ablation's).
        cost: cost model (the workload GPU's by default).
    """

    detailed_snapshot = True

    def __init__(self, workload: WorkloadSpec, config: JigsawConfig, *, name: str, cost: CostModel | None = None):
        self.name, self.cfg = name, config
        c = config
        self.config = (
            f"horizon {c.horizon}, {c.max_candidates} candidates, migration {'on' if c.migration else 'off'}, "
            f"co-location {'on' if c.colocation else 'off'}"
        )
        self.cost = cost or CostModel(workload.cluster.gpu, gpus_per_node=workload.cluster.gpus_per_node)
        self.n = workload.cluster.num_gpus
        self.specs = {p.name: p for p in workload.pipelines}
        self.index = {p.name: i for i, p in enumerate(workload.pipelines)}
        self.modes = {
            p.name: ExecutionMode(staleness=p.max_staleness if p.mode == "async" else 0, colocated=False)
            for p in workload.pipelines
        }
        table = (
            InterferenceTable.load(c.interference_file)
            if c.interference_file
            else InterferenceTable.from_cost_model(self.cost)
        )
        gpu = workload.cluster.gpu
        self.rm = ResourceManager(
            specs=self.specs,
            usable_bytes=usable_bytes(gpu),
            table=table,
            min_train={
                p.name: min_train_gpus(p.model, gpu, critic=p.critic, ref_model=p.ref_model) for p in workload.pipelines
            },
        )
        self.pred = Predictor(workload.pipelines, self.cost, self.n, workload.seed)
        # Training joins a long-tail replica (memory-bound) with the SM share the table says pays best.
        self.tail_share, _, self.train_speed = table.best_share("memory", "compute")
        self._leases: tuple | None = None  # the last snapshot's per-GPU lease arrays (see _lease_arrays)
        self._bytes: dict[tuple[str, str, int], float] = {}  # ResourceManager.stage_bytes, memoised
        self.alone_step_s = {p: sum(_interp(self.pred.prior(p)[st], self.n) for st in STAGES) for p in self.specs}

    def mode(self, pipeline: str) -> ExecutionMode:
        return self.modes[pipeline]

    # ---- the decision ------------------------------------------------------------------------------------------
    def schedule(self, snap: Snapshot) -> SchedulerOutput:
        """Candidates first (the greedy one first, so ties and ``horizon`` 0 keep it), then the best score."""
        greedy = self._fill(snap, set(snap.free_gpus), list(snap.ready))
        if self.cfg.horizon == 0 or not snap.ready:
            return SchedulerOutput(greedy)
        ctx = RollForward(self, snap)
        # NOTE: candidates x pipelines x horizon bounds the work of a decision; at scale fewer candidates are scored
        # (and only as many are built).
        limit = min(self.cfg.max_candidates, max(2, 4 * self.cfg.placement_budget // max(1, ctx.active * ctx.horizon)))
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
        if scores[best] > scores[0] * (1.0 - self.cfg.min_gain):
            return SchedulerOutput(greedy)
        return SchedulerOutput(unique[best])

    def _alternatives(self, snap: Snapshot, ctx: RollForward) -> Iterator[tuple]:
        """The other candidates, in order, built as they are asked for."""
        free, ready = set(snap.free_gpus), list(snap.ready)
        busy = len(free) < snap.num_gpus
        if busy:  # something will end and call us again: waiting is an option
            for r in ready:  # stages bound to their training GPUs never wait by choice
                if r.stage in self.cfg.deferrable:
                    yield self._fill(snap, free, [x for x in ready if x != r])
        if len(ready) > 1:
            yield self._fill(snap, free, ready[::-1])
        for r in ready:
            if r.stage == ROLLOUT:  # the whole free pool rather than a fair share
                yield self._fill(snap, free, ready, caps={r: len(free)})
        if self.cfg.colocation:
            yield self._fill(snap, free, ready, colocate=False)
        if self.cfg.migration:
            for plan in ctx.migrations.values():
                rest = [r for r in ready if r.pipeline != plan.action.pipeline]
                starts = self._fill(snap, free | set(plan.freed_gpus), rest, released=set(plan.freed_gpus))
                if any(set(a.gpus) & set(plan.freed_gpus) for a in starts):  # only when a ready stage takes them
                    yield (plan.action, *starts)

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
        colocate = self.cfg.colocation if colocate is None else colocate
        free, taken, actions = set(free), set(released or ()), []
        blocked = None  # GPUs a newcomer may not join: free or taken in this plan (built when first needed)
        views = {v.name: v for v in snap.pipelines}
        active = sum(v.arrived and not v.finished for v in snap.pipelines)
        fair = snap.num_gpus // max(1, active)
        # NOTE: stages bound to the GPUs holding their training state go first, so a rollout never takes them.
        training: set[str] = set()  # NOTE: a pipeline's training side runs one stage at a time
        for r in sorted(ready, key=lambda r: r.stage not in (UPDATE, WEIGHT_SYNC)):
            spec = self.specs[r.pipeline]
            if r.stage != ROLLOUT:
                if r.pipeline in training:
                    continue
                training.add(r.pipeline)
            cap = (caps or {}).get(r, self.n)
            if r.stage == ROLLOUT:
                unit, need = spec.rollout_tp, spec.rollout_tp
                if caps is None:  # a fair share of the pool, so concurrent rollouts each get some width
                    cap = max(unit, fair // unit * unit)
            else:
                unit, need = 1, self.rm.min_train[r.pipeline]
                if r.stage == WEIGHT_SYNC:
                    cap = min(cap, need)
            home = views[r.pipeline].train_gpus
            if r.stage in (UPDATE, WEIGHT_SYNC) and home:
                # Its training state is resident there: wait rather than re-shard from host.
                busy = [g for g in home if g not in free]
                if not busy:
                    actions.append(StartStage(r.pipeline, r.step, r.stage, tuple(home)))
                elif self.cfg.colocation and self._joinable(snap, r.pipeline, LOGPROB, busy, len(home)) == busy:
                    actions.append(StartStage(r.pipeline, r.step, r.stage, tuple(home), 1.0 - self.tail_share))
                else:
                    continue
                free -= set(home)
                taken |= set(home)
                if blocked is not None:
                    blocked[list(home)] = True
                continue
            else:
                gpus = sorted(free)[: max(need, min(cap, self._best_width(r.pipeline, r.stage, len(free))))]
                gpus = gpus[: len(gpus) // unit * unit]
            share = 1.0
            if colocate and r.stage in (ROLLOUT, LOGPROB):
                if blocked is None:
                    blocked = np.zeros(snap.num_gpus, dtype=bool)
                    blocked[list(free | taken)] = True
                joint = self._joinable(snap, r.pipeline, r.stage, None, max(need, len(gpus) + 1), blocked)
                speed = self.train_speed if r.stage != ROLLOUT else 1.0
                gain = r.stage == LOGPROB and speed * (len(gpus) + len(joint)) > len(gpus) * 1.25
                if joint and (len(gpus) < need or gain):
                    if r.stage == ROLLOUT:
                        joint = joint[: len(joint) // unit * unit] if unit == 1 else []
                    cand = sorted(gpus + joint)
                    if len(cand) >= need:
                        gpus = cand
                        share = self.tail_share if r.stage == ROLLOUT else 1.0 - self.tail_share
            if len(gpus) < need:
                continue
            if r.stage == LOGPROB and caps is None and len(gpus) < fair // 2 and len(free) < snap.num_gpus:
                continue  # a training step on a sliver of the pool takes longer than waiting for more
            actions.append(StartStage(r.pipeline, r.step, r.stage, tuple(gpus), share))
            free -= set(gpus)
            taken |= set(gpus)
            if blocked is not None:
                blocked[gpus] = True
        return tuple(actions)

    def _joinable(
        self, snap: Snapshot, pipeline: str, stage: str, candidates: list[int] | None, gpus: int, blocked=None
    ) -> list[int]:
        """:meth:`ResourceManager.colocatable` over ``candidates`` (every GPU not ``blocked`` when ``None``),
        vectorised over the snapshot's leases (read once per snapshot)."""
        single, pipe, roll, ok, free_bytes = self._lease_arrays(snap)
        key = (pipeline, stage, gpus)
        need = self._bytes[key] if key in self._bytes else self._bytes.setdefault(key, self.rm.stage_bytes(*key))
        mask = single & (pipe != self.index[pipeline]) & (roll != (stage == ROLLOUT)) & ok & (free_bytes >= need)
        if candidates is None:
            return np.flatnonzero(mask & ~blocked if blocked is not None else mask).tolist()
        return [g for g in candidates if mask[g]]

    def _lease_arrays(self, snap: Snapshot) -> tuple:
        """Per GPU: held by exactly one lease; its pipeline's index; whether it is a rollout replica; whether a
        newcomer may join it (a gang, or a replica in its memory-bound tail); free bytes. Cached for the last
        snapshot (held, so its identity is not reused)."""
        if self._leases is not None and self._leases[0] is snap:
            return self._leases[1]
        n, tail_live = snap.num_gpus, self.cfg.colocate_live_per_replica
        tail = {r.replica for r in snap.replicas if r.queued == 0 and r.live <= tail_live}
        single, pipe = np.zeros(n, dtype=bool), np.full(n, -1)
        roll, ok = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
        for g, leases in enumerate(snap.leases):
            if len(leases) == 1:
                lease = leases[0]
                single[g], pipe[g], roll[g] = True, self.index[lease.pipeline], lease.stage == ROLLOUT
                ok[g] = lease.replica is None or lease.replica in tail
        arrays = (single, pipe, roll, ok, np.asarray(snap.free_bytes, dtype=float))
        self._leases = (snap, arrays)
        return arrays

    def _best_width(self, pipeline: str, stage: str, available: int) -> int:
        """Training wider than its fastest predicted width only slows it (collectives across nodes)."""
        if stage == ROLLOUT:
            return available
        table = self.pred.prior(pipeline)[stage if stage != WEIGHT_SYNC else UPDATE]
        usable = [g for g in table if g <= available]
        if not usable:
            return available
        best = min(usable, key=lambda g: (table[g], g))
        return available if best == max(usable) else best
