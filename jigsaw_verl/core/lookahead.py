"""The JigsawRL scheduler: ``greedy`` and the look-ahead ``jigsaw`` policy.

One idea explains every case of :meth:`LookAheadPolicy.schedule`: build a few candidate action sets (start the
ready sub-stages first-fit, defer one, split the free GPUs differently, merge a rollout's tail to free GPUs
first, co-locate or not), roll each forward over the pipelines' predicted graphs for ``horizon`` more stages per
pipeline, and take the set whose predicted completions, weighted per pipeline, are smallest. With ``horizon`` 0
there is nothing to roll forward and the first candidate, the greedy one, is taken: that is ``greedy``.

The roll-forward is a list schedule on predicted durations (:class:`~jigsaw_verl.core.predictor.Predictor`):
each GPU becomes free when its leases are predicted to end; each pipeline's next stages start, in step order,
as soon as enough GPUs are free, on the width the prediction says finishes first. It is coarse on purpose: a
decision must take milliseconds at 1024 GPUs x 64 pipelines.
"""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass

from .cost_model import CostModel
from .graph import LOGPROB, ROLLOUT, STAGES, UPDATE, WEIGHT_SYNC
from .memory import min_train_gpus, usable_bytes
from .migration import MigrationPlan, plan_migration
from .predictor import Predictor, _interp
from .resources import InterferenceTable, ResourceManager
from .scheduling import ExecutionMode, Migrate, ReadyStage, SchedulerOutput, Snapshot, StartStage
from .spec import WorkloadSpec

_WAIT_OPTIONS = 4  # release times a roll-forward placement may wait for
_NEXT = {ROLLOUT: LOGPROB, LOGPROB: UPDATE, UPDATE: WEIGHT_SYNC, WEIGHT_SYNC: ROLLOUT}


@dataclass(frozen=True, kw_only=True)
class JigsawConfig:
    """Knobs of the scheduler (defaults chosen with ``scripts/bench_sim.py``).

    Attributes:
        horizon: stages per pipeline rolled forward when scoring a candidate; 0 is ``greedy``.
        max_candidates: candidate action sets scored per decision.
        migration: whether tails may be merged (k -> m replicas).
        colocation: whether two sub-stages may share a GPU with SM shares.
        tail_live_per_replica: a rollout is in its tail below this many live requests per replica.
        min_gain: relative predicted gain over the greedy plan an alternative needs to be taken.
        max_live_per_target: live requests a merge target may end up with.
        interference_file: a profiled interference table (JSON, see :mod:`.resources`); ``None`` derives it from
            the cost model.
    """

    horizon: int = 4
    max_candidates: int = 16
    migration: bool = True
    colocation: bool = True
    min_gain: float = 0.02
    tail_live_per_replica: float = 1.0
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
        self.alone_step_s = {p: sum(_interp(self.pred.prior(p)[st], self.n) for st in STAGES) for p in self.specs}

    def mode(self, pipeline: str) -> ExecutionMode:
        return self.modes[pipeline]

    # ---- the decision ------------------------------------------------------------------------------------------
    def schedule(self, snap: Snapshot) -> SchedulerOutput:
        """Candidates first (the greedy one first, so ties and ``horizon`` 0 keep it), then the best score."""
        greedy = self._fill(snap, set(snap.free_gpus), list(snap.ready))
        if self.cfg.horizon == 0 or not snap.ready:
            return SchedulerOutput(greedy)
        ctx = _Context(self, snap)
        cands = [greedy] + self._alternatives(snap, ctx)
        seen, unique = set(), []
        for c in cands:
            if c not in seen:
                seen.add(c)
                unique.append(c)
        unique = unique[: self.cfg.max_candidates]
        if len(unique) == 1:
            return SchedulerOutput(greedy)
        scores = [ctx.score(c) for c in unique]
        best = min(range(len(unique)), key=lambda i: (scores[i], i))
        # NOTE: predictions are coarse; leave the greedy plan only for a clear predicted gain.
        if scores[best] > scores[0] * (1.0 - self.cfg.min_gain):
            return SchedulerOutput(greedy)
        return SchedulerOutput(unique[best])

    def _alternatives(self, snap: Snapshot, ctx: _Context) -> list[tuple]:
        free, ready = set(snap.free_gpus), list(snap.ready)
        busy = any(snap.leases[g] for g in range(snap.num_gpus))
        out: list[tuple] = []
        if busy:  # something will end and call us again: waiting is an option
            for r in ready:  # stages bound to their training GPUs never wait by choice
                if r.stage in (ROLLOUT, LOGPROB):
                    out.append(self._fill(snap, free, [x for x in ready if x != r]))
        if len(ready) > 1:
            out.append(self._fill(snap, free, ready[::-1]))
        for r in ready:
            if r.stage == ROLLOUT:  # the whole free pool rather than a fair share
                out.append(self._fill(snap, free, ready, caps={r: len(free)}))
        if self.cfg.colocation:
            out.append(self._fill(snap, free, ready, colocate=False))
        if self.cfg.migration:
            for plan in ctx.migrations.values():
                rest = [r for r in ready if r.pipeline != plan.action.pipeline]
                starts = self._fill(snap, free | set(plan.freed_gpus), rest, released=set(plan.freed_gpus))
                if any(set(a.gpus) & set(plan.freed_gpus) for a in starts):  # only when a ready stage takes them
                    out.append((plan.action, *starts))
        return out

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
                elif self.cfg.colocation and self.rm.colocatable(snap, r.pipeline, LOGPROB, busy, len(home)) == busy:
                    actions.append(StartStage(r.pipeline, r.step, r.stage, tuple(home), 1.0 - self.tail_share))
                else:
                    continue
                free -= set(home)
                taken |= set(home)
                continue
            else:
                gpus = sorted(free)[: min(cap, self._best_width(r.pipeline, r.stage, len(free)))]
                gpus = gpus[: len(gpus) // unit * unit]
            share = 1.0
            if colocate and r.stage in (ROLLOUT, LOGPROB):
                others = [g for g in range(snap.num_gpus) if g not in free and g not in taken]
                joint = self.rm.colocatable(snap, r.pipeline, r.stage, others, max(need, len(gpus) + 1))
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
        return tuple(actions)

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


class _Context:
    """One decision's predictions: when every GPU frees, the migrations worth pricing, and the roll-forward."""

    def __init__(self, policy: LookAheadPolicy, snap: Snapshot):
        self.p, self.snap = policy, snap
        self.corr = policy.pred.corrections(snap.history)
        self.curves = {}
        for h in snap.history:
            if h.stage == ROLLOUT:
                self.curves[h.pipeline] = h
        now = snap.now_s
        self.gpu_end = [now] * snap.num_gpus
        self.stage_end: dict[str, float] = {}
        self.replica_end: dict[int, float] = {}
        self.migrations: dict[str, MigrationPlan] = {}
        by_pipe: dict[str, list] = {}
        for r in snap.replicas:
            by_pipe.setdefault(r.pipeline, []).append(r)
        for v in snap.pipelines:
            for (_, stage, gpus), since in zip(v.running, v.running_since_s):
                if stage == ROLLOUT:
                    reps = by_pipe.get(v.name, [])
                    total = self.dur(v.name, ROLLOUT, len(gpus))
                    live = [r.live + r.queued for r in reps]
                    rem = policy.pred.replica_remaining_s(v.name, self.curves.get(v.name), total, live)
                    for r, t in zip(reps, rem):
                        self.replica_end[r.replica] = now + t
                        for g in r.gpus:
                            self.gpu_end[g] = max(self.gpu_end[g], now + t)
                    end = now + max(rem, default=0.0)
                    if policy.cfg.migration and policy.cfg.horizon > 0 and reps:
                        colocated = any(len(snap.leases[g]) > 1 for r in reps for g in r.gpus)
                        plan = None if colocated else self._plan(v.name, reps, rem)
                        if plan is not None and plan.worth_it():
                            self.migrations[v.name] = plan
                else:
                    end = max(now, since + self.dur(v.name, stage, len(gpus)))
                    for g in gpus:
                        self.gpu_end[g] = max(self.gpu_end[g], end)
                self.stage_end[v.name] = max(self.stage_end.get(v.name, now), end)

    def _plan(self, name: str, reps, rem) -> MigrationPlan | None:
        cfg = self.p.cfg
        return plan_migration(
            self.p.specs[name],
            self.p.cost,
            reps,
            rem,
            tail_live_per_replica=cfg.tail_live_per_replica,
            max_live_per_target=cfg.max_live_per_target,
        )

    def dur(self, name: str, stage: str, gpus: int) -> float:
        return self.corr.get((name, stage), 1.0) * _interp(self.p.pred.prior(name)[stage], max(1, gpus))

    def _best(self, name: str, stage: str, k: int) -> tuple[int, float]:
        """Width (<= k) that finishes ``stage`` first, and its duration; update and sync keep the log-prob's."""
        spec = self.p.specs[name]
        if stage in (UPDATE, WEIGHT_SYNC) and name in self.home:
            g = min(k, self.home[name])
            return g, self.dur(name, stage, g)
        if stage == ROLLOUT:
            k = k // spec.rollout_tp * spec.rollout_tp
            return k, self.dur(name, stage, k)
        widths = [g for g in self.p.pred.widths(name, stage if stage != WEIGHT_SYNC else UPDATE) if g <= k] + [k]
        g = min(widths, key=lambda g: (self.dur(name, stage, g), g))
        return g, self.dur(name, stage, g)

    def score(self, actions: tuple) -> float:
        """Weighted predicted completion of every pipeline's next ``horizon`` stages under ``actions``."""
        snap, p, now = self.snap, self.p, self.snap.now_s
        gpu_end = list(self.gpu_end)
        first: dict[str, tuple[float, str, int, int]] = {}  # pipeline -> (ready s, next stage, step, stages seen)
        for v in snap.pipelines:
            if not v.arrived or v.finished or not v.running:
                continue
            gang = [(s, st) for s, st, _ in v.running if st != ROLLOUT]
            if gang:
                s, st = gang[0]
                first[v.name] = (self.stage_end[v.name], _NEXT[st], s + (st == WEIGHT_SYNC), 1)
            else:
                first[v.name] = (self.stage_end[v.name], LOGPROB, v.steps_done, 1)
        for r in snap.ready:  # the earliest ready stage of an idle pipeline waits for GPUs from now
            if r.pipeline not in first:
                first[r.pipeline] = (now, r.stage, r.step, 0)
        for a in actions:
            if isinstance(a, Migrate):
                plan = self.migrations[a.pipeline]
                for g in plan.freed_gpus:
                    gpu_end[g] = now
                tail = max(self.replica_end[i] for i in a.targets) - now
                end = now + plan.reprefill_s + tail * plan.slowdown
                for i in a.targets:
                    for g in next(r.gpus for r in snap.replicas if r.replica == i):
                        gpu_end[g] = end
                first[a.pipeline] = (end, LOGPROB, first[a.pipeline][2], 1)
        for a in actions:
            if isinstance(a, StartStage):
                d = self.dur(a.pipeline, a.stage, len(a.gpus))
                if a.sm_share < 1.0 and a.stage != ROLLOUT:
                    d /= p.train_speed
                for g in a.gpus:
                    if gpu_end[g] > now:  # co-located: the partner slows down too
                        slowed = now + (gpu_end[g] - now) / (p.train_speed if a.stage == ROLLOUT else 0.9)
                        gpu_end[g] = max(slowed, now + d)
                    else:
                        gpu_end[g] = now + d
                first[a.pipeline] = (now + d, _NEXT[a.stage], a.step + (a.stage == WEIGHT_SYNC), 1)
        self.home = {v.name: len(v.train_gpus) for v in snap.pipelines if v.train_gpus}
        for a in actions:
            if isinstance(a, StartStage) and a.stage == LOGPROB:
                self.home[a.pipeline] = len(a.gpus)
        avail = sorted(gpu_end)
        heap = [(t, p.index[name], name, stage, step, depth) for name, (t, stage, step, depth) in first.items()]
        heapq.heapify(heap)
        total, worst = 0.0, 0.0
        while heap:
            t, i, name, stage, step, depth = heapq.heappop(heap)
            spec = p.specs[name]
            if depth >= p.cfg.horizon or step >= spec.steps or (stage == WEIGHT_SYNC and step == spec.steps - 1):
                weight = spec.weight
                limit = spec.max_latency_inflation
                span = t - now
                excess = max(0.0, span - limit * p.alone_step_s[name] * depth / 4) if limit else 0.0
                total += weight * (t - now) + 10.0 * weight * excess
                worst = max(worst, weight * (t - now))
                continue
            need = spec.rollout_tp if stage == ROLLOUT else p.rm.min_train[name]
            # Start when it finishes first: now on what is free, or later on more (the next few releases).
            start, g, d = None, 0, 0.0
            tau, tried = max(t, avail[need - 1]), 0
            while tau is not None and tried < _WAIT_OPTIONS:
                k = bisect.bisect_right(avail, tau)
                gg, dd = self._best(name, stage, k)
                if start is None or tau + dd < start + d - 1e-9:
                    start, g, d = tau, gg, dd
                tried += 1
                tau = avail[k] if k < len(avail) else None
            if stage == LOGPROB:
                self.home[name] = g
            del avail[:g]
            end = start + d
            for _ in range(g):
                bisect.insort(avail, end)
            nxt = _NEXT[stage]
            heapq.heappush(heap, (end, i, name, nxt, step + (stage == WEIGHT_SYNC), depth + 1))
        # NOTE: the latest pipeline first (all finish together, none starved), then the sum (no idle waste).
        return worst + total / max(1, len(p.specs))
