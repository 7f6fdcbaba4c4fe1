"""The look-ahead's model of the near future: roll a candidate action set forward over predicted graphs.

Per GPU it keeps when the GPU is predicted to free (``end``), from when a long-tail replica on it could host a
training stage (``host_from``) and whose replica it is. Each pipeline then advances through its next stages
(rollout -> log-prob -> update -> weight sync -> rollout ...) in time order; a stage starts at the best of a few
moments (now, the next GPU releases, the next tails that could host it) on the width the predictor says finishes
first, exclusively or joined onto another pipeline's GPUs as the policy joins them: training onto rollout tails at
the interference table's speed, a rollout short of GPUs onto a training gang at the cost model's co-location speeds
for its average load (:meth:`~jigsaw_verl.policy.jigsaw.planning.PlanningModel.boarding_speeds`). A stage slowed
by a newcomer delays its own pipeline's next stage. The widths come from the policy's own rules
(:class:`~jigsaw_verl.policy.jigsaw.planning.PlanningModel`), so a candidate is scored by the future it leads to.
"""

from __future__ import annotations

import heapq
import math

import numpy as np

from jigsaw_verl.model.graph import LOGPROB, ROLLOUT, UPDATE, WEIGHT_SYNC
from jigsaw_verl.policy.interface import Migrate, Snapshot, StartStage, WidenTail
from jigsaw_verl.policy.jigsaw.migration_planner import (
    MigrationPlan,
    WideningPlan,
    draining,
    in_tail,
    plan_migration,
    plan_widening,
)
from jigsaw_verl.policy.jigsaw.planning import PlanningModel, active_pipelines, fair_share

NEXT_STAGE = {ROLLOUT: LOGPROB, LOGPROB: UPDATE, UPDATE: WEIGHT_SYNC, WEIGHT_SYNC: ROLLOUT}
WAIT_OPTIONS = 3  # later moments a placement may wait for (GPU releases, tails to join)
TAIL_SLOWDOWN = 0.9  # speed of a tail replica hosting a training stage (the table's, at the chosen share)


def widening_due(spec, reps: list, enabled: bool, live_per_replica: float) -> bool:
    """Whether a running rollout (its live ``reps``) is in the tail a wider replica may take: the pipeline may
    widen, nothing is queued, few live requests are left, and a wider TP is left to move to."""
    return (
        enabled
        and bool(reps)
        and (spec.rollout_elastic_tp or 0) > max(len(r.gpus) for r in reps)
        and all(r.queued == 0 for r in reps)
        and sum(r.live for r in reps) <= live_per_replica * len(reps)
    )


class RollForward:
    """One decision's predictions and the scoring of candidates.

    Args:
        planning: the policy's planning model (its predictor, knobs, specs, width rules).
        snap: the snapshot decided on.
    """

    def __init__(self, planning: PlanningModel, snap: Snapshot):
        self.planning, self.snap = planning, snap
        self.corr = planning.pred.corrections(snap.history)
        self._dur: dict[tuple[str, str, int], float] = {}
        self._width_memo: dict[tuple[str, str, int], int] = {}
        self.curves = {h.pipeline: h for h in snap.history if h.stage == ROLLOUT}
        now, n = snap.now_s, snap.num_gpus
        active = self.active = active_pipelines(snap)
        self.fair = fair_share(snap)
        self.horizon = min(planning.knobs.horizon, max(1, planning.knobs.placement_budget // max(1, active)))
        self.end = np.full(n, now)
        self.host_from = np.full(n, math.inf)
        self.owner = np.full(n, -1)
        # per GPU, the pipeline whose training gang (log-prob or update) holds it alone, which a rollout short of
        # GPUs may join (as the policy's _join_others does); -1 otherwise
        self.gang = np.full(n, -1)
        self._gang = self.gang
        self._fits: dict[tuple[str, int], bool] = {}
        self.stage_end: dict[str, float] = {}
        self.replica_end: dict[int, float] = {}
        self.replica_gpus = {r.replica: r.gpus for r in snap.replicas}
        self.migrations: dict[str, MigrationPlan] = {}
        self.widenings: dict[str, WideningPlan] = {}
        by_pipe: dict[str, list] = {}
        for r in snap.replicas:
            by_pipe.setdefault(r.pipeline, []).append(r)
        for v in snap.pipelines:
            # an executor that does not say when its stages started: they started now
            for (_, stage, gpus), since in zip(v.running, v.running_since_s or (now,) * len(v.running)):
                if stage == ROLLOUT:
                    end = self._running_rollout(v.name, by_pipe.get(v.name, []), len(gpus))
                else:
                    end = max(now, since + self.dur(v.name, stage, len(gpus)))
                    idx = list(gpus)
                    self.end[idx] = np.maximum(self.end[idx], end)
                    if stage in (LOGPROB, UPDATE):
                        alone = [g for g in idx if len(snap.leases[g]) == 1] if snap.leases else idx
                        self.gang[alone] = planning.index[v.name]
                self.stage_end[v.name] = max(self.stage_end.get(v.name, now), end)

    def _running_rollout(self, name: str, reps: list, width: int) -> float:
        m, now = self.planning, self.snap.now_s
        total = self.dur(name, ROLLOUT, width)
        live = [r.live + r.queued for r in reps]
        curve = self.curves.get(name)
        rem = m.pred.replica_remaining_s(name, curve, total, live)
        host = now + m.pred.time_until_outstanding_s(
            name, curve, total, sum(live), int(m.knobs.colocate_live_per_replica * len(reps))
        )
        # a hybrid-engine rollout's replicas sleep together: an idle one holds its GPUs until the last one is done
        held = [max(rem, default=0.0)] * len(rem) if name in m.hybrid else rem
        if reps:  # every replica's GPUs at once
            self.replica_end.update((r.replica, now + t) for r, t in zip(reps, rem))
            idx = [g for r in reps for g in r.gpus]
            np.maximum.at(self.end, idx, np.repeat(now + np.asarray(held), [len(r.gpus) for r in reps]))
            self.host_from[idx] = math.inf if name in m.refilled else host
            self.owner[idx] = m.index[name]
        colocated = any(len(self.snap.leases[g]) > 1 for r in reps for g in r.gpus)
        if m.knobs.horizon > 0 and reps and not colocated:
            # an overlapping rollout's older steps drain on their own replicas while newer ones run: merge those
            tail = draining(reps, m.specs[name].max_staleness) if name in m.refilled else range(len(reps))
            group = [reps[i] for i in tail]
            if m.knobs.migration and in_tail(group, m.knobs.tail_live_per_replica):
                plan = self._plan(name, group, [held[i] for i in tail])
                if plan is not None and plan.worth_it():
                    self.migrations[name] = plan
            if widening_due(m.specs[name], reps, m.knobs.elastic_tail, m.knobs.widen_live_per_replica):
                wide = plan_widening(m.specs[name], m.cost, reps, rem, self.snap.free_gpus, self.snap.num_gpus)
                if wide is not None:
                    self.widenings[name] = wide
        return now + max(rem, default=0.0)

    def _plan(self, name: str, reps, rem) -> MigrationPlan | None:
        m = self.planning
        return plan_migration(
            m.specs[name],
            m.cost,
            reps,
            rem,
            tail_live_per_replica=m.knobs.tail_live_per_replica,
            max_live_per_target=m.knobs.max_live_per_target,
        )

    def dur(self, name: str, stage: str, gpus: int) -> float:
        """Predicted seconds of ``stage`` of ``name`` on ``gpus`` GPUs running alone (memoised per decision)."""
        key = (name, stage, gpus)
        if key not in self._dur:
            self._dur[key] = self.corr.get((name, stage), 1.0) * self.planning.pred.prior_s(name, stage, gpus)
        return self._dur[key]

    def _width(self, name: str, stage: str, k: int) -> int:
        """The width the policy would give ``stage`` out of ``k`` GPUs."""
        m = self.planning
        if stage == ROLLOUT:
            tp = m.specs[name].rollout_tp
            return min(k, m.rollout_cap(name, self.fair)) // tp * tp
        if k <= 0:
            return 0
        return max(min(k, m.rm.min_train[name]), m.best_width(name, LOGPROB, k))

    # ---- scoring ---------------------------------------------------------------------------------------------
    def score(self, actions: tuple) -> float:
        """Predicted completion of every pipeline's next ``self.horizon`` stages under ``actions``: the latest one
        (weighted) plus the mean, so none is starved and no GPU time is wasted."""
        snap, m, now = self.snap, self.planning, self.snap.now_s
        end, host, owner = self.end.copy(), self.host_from.copy(), self.owner.copy()
        self._gang = self.gang.copy()  # NOTE: this call's gangs, read by _occupy and _place
        self._late: dict[str, float] = {}  # NOTE: pipelines whose running stage a newcomer slowed: its new end
        home = {v.name: np.array(v.train_gpus) for v in snap.pipelines if v.train_gpus}  # GPUs of training state
        state: dict[str, tuple[float, str, int, int]] = {}  # pipeline -> (ready s, next stage, step, depth)
        for v in snap.pipelines:
            if not v.arrived or v.finished or not v.running:
                continue
            gang = [(s, st) for s, st, _ in v.running if st != ROLLOUT]
            if gang:
                s, st = gang[0]
                state[v.name] = (self.stage_end[v.name], NEXT_STAGE[st], s + (st == WEIGHT_SYNC), 1)
            else:
                state[v.name] = (self.stage_end[v.name], LOGPROB, v.steps_done, 1)
        for r in snap.ready:  # the earliest ready stage of an idle pipeline waits for GPUs from now
            if r.pipeline not in state:
                state[r.pipeline] = (now, r.stage, r.step, 0)
        for a in actions:
            if isinstance(a, (Migrate, WidenTail)):
                stop = self._move_tail(a, end, host, owner)
                state[a.pipeline] = (stop, LOGPROB, state[a.pipeline][2], 1)
        early = self._start(actions, state, home, end, host, owner)
        heap = [(t, m.index[name], name, stage, step, depth) for name, (t, stage, step, depth) in state.items()]
        heapq.heapify(heap)
        total, worst = 0.0, 0.0
        while heap:
            t, i, name, stage, step, depth = heapq.heappop(heap)
            late = self._late.pop(name, t)
            if late > t + 1e-9:  # a newcomer slowed the stage it waits on
                heapq.heappush(heap, (late, i, name, stage, step, depth))
                continue
            spec = m.specs[name]
            if depth >= self.horizon or step >= spec.steps or (stage == WEIGHT_SYNC and step == spec.steps - 1):
                limit = spec.max_latency_inflation
                excess = max(0.0, (t - now) - limit * m.alone_step_s[name] * depth / 4) if limit else 0.0
                total += spec.weight * (t - now) + 10.0 * spec.weight * excess
                worst = max(worst, spec.weight * (t - now))
                continue
            ahead = early.get(name)
            if ahead is not None and (stage, step) == (ROLLOUT, ahead[0]):
                stop = max(t, ahead[1])  # already running
            else:
                stop = (
                    self._place_at_home(end, host, owner, home[name], name, stage, t)
                    if stage in (UPDATE, WEIGHT_SYNC) and name in home
                    else self._place(end, host, owner, home, name, stage, t)
                )
            heapq.heappush(heap, (stop, i, name, NEXT_STAGE[stage], step + (stage == WEIGHT_SYNC), depth + 1))
        return worst + total / max(1, len(m.specs))

    def _start(self, actions: tuple, state: dict, home: dict, end, host, owner) -> dict[str, tuple[int, float]]:
        """Apply the candidate's starts to the release times and to each pipeline's ``state``; return, per pipeline,
        the (step, end) of a rollout started ahead of its chain (overlapping an earlier step)."""
        m, now = self.planning, self.snap.now_s
        early: dict[str, tuple[int, float]] = {}
        for a in actions:
            if not isinstance(a, StartStage):
                continue
            d = self.dur(a.pipeline, a.stage, len(a.gpus))
            if a.stage == LOGPROB:
                home[a.pipeline] = np.array(a.gpus)
            idx = np.array(a.gpus)
            if a.sm_share < 1.0:
                busy = idx[end[idx] > now]
                speeds = m.boarding_speeds(a.pipeline) if a.stage == ROLLOUT else (m.train_speed, TAIL_SLOWDOWN)
                self._slow(end, owner, busy, now, speeds[1], a.stage == ROLLOUT)
                d /= speeds[0]
            self._occupy(end, host, owner, idx, now, d, a.pipeline, a.stage, exclusive=a.sm_share == 1.0)
            if a.stage == ROLLOUT and state.get(a.pipeline, (now, ROLLOUT, a.step))[1:3] != (ROLLOUT, a.step):
                early[a.pipeline] = (a.step, now + d)  # overlapping an earlier step: its chain gets here later
            else:
                state[a.pipeline] = (now + d, NEXT_STAGE[a.stage], a.step + (a.stage == WEIGHT_SYNC), 1)
        return early

    def _move_tail(self, a: Migrate | WidenTail, end, host, owner) -> float:
        """Apply a planned merge or tail move to the release times; return when the rollout is predicted to end."""
        now = self.snap.now_s
        plan = self.migrations[a.pipeline] if isinstance(a, Migrate) else self.widenings[a.pipeline]
        idx = list(plan.freed_gpus)
        end[idx], host[idx], owner[idx] = now, math.inf, -1
        if isinstance(a, WidenTail):
            end[list(a.gpus)], host[list(a.gpus)] = now + plan.end_s, math.inf
            owner[list(a.gpus)] = self.planning.index[a.pipeline]
            return now + plan.end_s
        tail = max(self.replica_end[i] for i in a.targets) - now
        stop = now + plan.reprefill_s + tail * plan.slowdown
        for i in a.targets:
            end[list(self.replica_gpus[i])] = stop
        return stop

    def _occupy(
        self, end, host, owner, idx, start: float, d: float, name: str, stage: str, *, exclusive: bool = True
    ) -> None:
        m = self.planning
        end[idx] = np.maximum(end[idx], start + d)
        self._gang[idx] = m.index[name] if exclusive and stage in (LOGPROB, UPDATE) else -1
        if stage == ROLLOUT:
            reps = max(1, len(idx) // m.specs[name].rollout_tp)  # the tail begins per replica of this width
            host[idx] = (
                math.inf
                if name in m.refilled
                else start + d * m.pred.tail_fraction(name, m.knobs.colocate_live_per_replica, reps)
            )
            owner[idx] = m.index[name]
        else:
            host[idx], owner[idx] = math.inf, -1

    @staticmethod
    def _moments(es: np.ndarray, host: np.ndarray, t: float, joins: bool) -> list[float]:
        """``t`` and the next ``WAIT_OPTIONS`` distinct moments after it a GPU frees (``es``: the release times,
        sorted) or, for a stage that ``joins`` tails, a tail becomes joinable (``host``)."""
        later = es[int(es.searchsorted(t, "right")) :]
        if joins:
            hs = host[(host > t) & (host < math.inf)]
            if hs.size:
                later = np.sort(np.concatenate([later, hs]))
        if later.size > 1:  # distinct values of a sorted array
            later = later[np.concatenate(([True], later[1:] != later[:-1]))]
        return [t, *later[:WAIT_OPTIONS].tolist()]

    def _place_at_home(self, end, host, owner, idx: np.ndarray, name: str, stage: str, t: float) -> float:
        """Start an update or weight sync of ``name`` (ready at ``t``) on the GPUs holding its training state,
        ``idx``, as the policy does (:meth:`LookAheadPolicy._start_at_home`): when they are all free, or, for an
        update with co-location on, beside other pipelines' rollout tails on them once those are joinable. A sync
        never joins a rollout (as live). Returns its predicted end."""
        m = self.planning
        d = self.dur(name, stage, len(idx))
        tau = max(t, float(end[idx].max()))
        finish, co = tau + d, None
        if stage == UPDATE and m.knobs.colocation:
            busy = idx[end[idx] > t]
            tails = owner[busy]
            if busy.size and np.all(tails >= 0) and np.all(tails != m.index[name]):
                join = max(t, float(host[busy].max()))
                if join < tau and join + d / m.train_speed < finish - 1e-9:
                    tau, finish, co = join, join + d / m.train_speed, busy
        if co is not None:
            self._slow(end, owner, co, tau, TAIL_SLOWDOWN, False)
            slowed = end[co].copy()
        self._occupy(end, host, owner, idx, tau, finish - tau, name, stage)
        if co is not None:
            end[co] = np.maximum(slowed, finish)
            self._gang[co] = -1
        return finish

    def _place(self, end, host, owner, home, name: str, stage: str, t: float) -> float:
        """Start ``stage`` of ``name`` (ready at ``t``) where it finishes first; return its predicted end.

        The moments tried are ``t`` and the next ``WAIT_OPTIONS`` distinct GPU releases (and, for training, tails
        becoming joinable); free GPUs per moment are counted on the sorted release times, and the GPUs themselves
        are looked up only for the moment chosen."""
        m = self.planning
        need = m.specs[name].rollout_tp if stage == ROLLOUT else m.rm.min_train[name]
        joins = stage in (LOGPROB, UPDATE) and m.knobs.colocation  # a weight sync never joins a tail (as live)
        boards = stage == ROLLOUT and m.knobs.colocation  # a rollout short of GPUs joins another's training gang
        me = m.index[name]
        es = np.sort(end)
        moments = self._moments(es, host, t, joins)
        at = np.asarray(moments)
        taus = at + 1e-9
        counts = es.searchsorted(taus, "right").tolist()
        if joins:
            joinable = (host <= at[:, None]) & (end > taus[:, None]) & (owner != me)
        elif boards:
            joinable = (self._gang >= 0) & (self._gang != me) & self._fits_beside(name) & (end > taus[:, None])
        if joins or boards:
            co_counts = joinable.sum(axis=1).tolist()
        width, durs = self._width_memo, self._dur
        best = None
        for i, tau in enumerate(moments):
            k = counts[i]
            key = (name, stage, k)
            g = width[key] if key in width else width.setdefault(key, self._width(name, stage, k))
            if g >= need:
                dk = (name, stage, g)
                finish = tau + (durs[dk] if dk in durs else self.dur(name, stage, g))
                if best is None or finish < best[0] - 1e-9:
                    best = (finish, i, g, None)
            elif boards and co_counts[i]:
                extra = co_counts[i] // need * need
                if g + extra >= need:
                    finish = tau + self.dur(name, stage, g + extra) / m.boarding_speeds(name)[0]
                    if best is None or finish < best[0] - 1e-9:
                        best = (finish, i, g, extra)
            # NOTE: unlike the policy, a sync pipeline's log-prob may widen onto tails here when not short of GPUs:
            # the variant that mirrors the policy measured worse over seeds 0-3 (README, knob sweep)
            if joins and co_counts[i]:
                key = (name, stage, k + co_counts[i])
                g2 = width[key] if key in width else width.setdefault(key, self._width(name, stage, key[2]))
                if g2 >= need and g2 > g:
                    finish = tau + self.dur(name, stage, g2) / m.train_speed
                    if best is None or finish < best[0] - 1e-9:
                        best = (finish, i, k, g2 - k)
        if best is None:  # nothing ever frees in the model: start when the last GPU frees
            tau = float(es[-1])
            g = max(need, self._width(name, stage, len(end)))
            finish, free, co = tau + self.dur(name, stage, g), np.argsort(end)[:g], None
        else:
            finish, i, g, extra = best
            tau = moments[i]
            free = (end <= taus[i]).nonzero()[0][:g]
            co = None if extra is None else joinable[i].nonzero()[0][:extra]
        if stage == LOGPROB:
            home[name] = free if co is None else np.concatenate([free, co])
        self._occupy(end, host, owner, free, tau, finish - tau, name, stage)
        if co is not None and co.size:
            self._slow(end, owner, co, tau, m.boarding_speeds(name)[1] if boards else TAIL_SLOWDOWN, boards)
            end[co] = np.maximum(end[co], finish)
            host[co], owner[co], self._gang[co] = math.inf, -1, -1
        return finish

    def _slow(self, end, owner, idx: np.ndarray, tau: float, speed: float, rollout_joins: bool) -> None:
        """The incumbents on ``idx`` run at ``speed`` from ``tau`` beside a newcomer (a training gang beside a rollout
        that boards it, a tail beside a training stage); their pipelines' next stages wait for the new ends."""
        if not idx.size:
            return
        m = self.planning
        end[idx] = tau + (end[idx] - tau) / speed
        who = self._gang[idx] if rollout_joins else owner[idx]
        for j in np.unique(who[who >= 0]).tolist():
            name = m.names[j]
            self._late[name] = max(self._late.get(name, 0.0), float(end[idx][who == j].max()))

    def _fits_beside(self, name: str) -> np.ndarray:
        """Per GPU, whether a replica of ``name`` fits in memory beside the training gang holding it (its pipeline's
        training state over the fewest GPUs that hold it: the most it takes per GPU)."""
        m, gang = self.planning, self._gang
        ok = np.zeros(gang.shape, dtype=bool)
        for j in np.unique(gang[gang >= 0]).tolist():
            other = m.names[j]
            key = (name, j)
            if key not in self._fits:
                need = m.rm.stage_bytes(name, ROLLOUT, m.specs[name].rollout_tp) + m.rm.stage_bytes(
                    other, LOGPROB, m.rm.min_train[other]
                )
                self._fits[key] = need <= m.cost.gpu.memory_bytes
            ok |= (gang == j) & self._fits[key]
        return ok
