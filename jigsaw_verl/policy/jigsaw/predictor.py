"""The predictor: each pipeline's next step, from the cost model's predicted graph and the last few steps.

Consecutive steps of a pipeline look alike (its length profile drifts slowly), so the predictor keeps two things
per pipeline:

- a *prior*, built once from the workload spec alone: the sub-stage graph of a step whose lengths are drawn from
  the spec's distributions with the predictor's own seed (never the run's lengths), rolled out on every width the
  pool allows (:func:`~jigsaw_verl.model.graph.rollout_nodes`) and trained on every training width;
- an online *correction*: the median ratio of observed to prior durations over the last ``window`` steps, so
  drift and the prior's sampling error are corrected as timings arrive.

For a rollout in progress it predicts per replica when it frees its GPUs from the last step's live-batch curve
(when each response finished): the replica with the ``i``-th most live requests frees when ``i`` requests of the
step are left. Everything is a pure function of the snapshot's history; nothing is mutated after construction
except a memo of priors.
"""

from __future__ import annotations

import bisect
from dataclasses import replace

import numpy as np

from jigsaw_verl.model.cost_model import CostModel
from jigsaw_verl.model.graph import (
    LOGPROB,
    ROLLOUT,
    UPDATE,
    WEIGHT_SYNC,
    assign_least_loaded,
    logprob_nodes,
    rollout_nodes,
    step_requests,
    update_nodes,
    weight_sync_node,
)
from jigsaw_verl.model.lengths import sample_steps
from jigsaw_verl.model.memory import kv_capacity_tokens
from jigsaw_verl.model.rollout_engine import ReplicaEngine
from jigsaw_verl.model.spec import PipelineSpec
from jigsaw_verl.policy.interface import StageTiming

PRIOR_SEED_OFFSET = 7919  # the prior's lengths are a different draw than any run's


def _widths(unit: int, num_gpus: int, cap: int) -> list[int]:
    out, g = [], unit
    while g <= min(num_gpus, cap):
        out.append(g)
        g *= 2
    if out[-1] != min(num_gpus, cap) and min(num_gpus, cap) % unit == 0:
        out.append(min(num_gpus, cap))
    return out


def _interp(table: dict[int, float], g: int) -> float:
    """Log-linear interpolation of a duration table over widths (clamped at its ends)."""
    keys = sorted(table)
    if g <= keys[0]:
        return table[keys[0]] * (keys[0] / g if g < keys[0] else 1.0)
    if g >= keys[-1]:
        return table[keys[-1]]
    i = bisect.bisect_right(keys, g)
    lo, hi = keys[i - 1], keys[i]
    x = (np.log(g) - np.log(lo)) / (np.log(hi) - np.log(lo))
    return float(table[lo] * (1 - x) + table[hi] * x)


def _median(vals: list[float]) -> float:
    """``np.median`` of a short list, without numpy's overhead."""
    v, n = sorted(vals), len(vals)
    return float(v[n // 2]) if n % 2 else float((v[n // 2 - 1] + v[n // 2]) / 2)


class Predictor:
    """Predicted durations per pipeline.

    Args:
        specs: the pipelines.
        cost: the cost model.
        num_gpus: pool size.
        seed: the workload seed (offset so the prior never sees the run's lengths).
        window: steps the online correction looks back.
        hybrid_sync: pipelines whose weight sync is verl's hybrid-engine reshard and wake on its training GPUs;
            the others broadcast to as many rollout GPUs.
    """

    def __init__(
        self,
        specs: tuple[PipelineSpec, ...],
        cost: CostModel,
        num_gpus: int,
        seed: int,
        window: int = 3,
        *,
        hybrid_sync: frozenset[str] = frozenset(),
    ):
        self.specs = {p.name: p for p in specs}
        self.hybrid_sync = hybrid_sync
        self.cost, self.n, self.seed, self.window = cost, num_gpus, seed, window
        self._prior: dict[str, dict[str, dict[int, float]]] = {}
        self._curves: dict[str, tuple[float, ...]] = {}
        self._rollout_needs: dict[str, tuple[float, float]] = {}
        self._last_corrections: tuple | None = None  # (history, corrections) of the last call
        self._prior_s: dict[tuple[str, str, int], float] = {}  # prior_s answers (the priors never change)

    def _finish_offsets(self, spec: PipelineSpec, samples, replicas: int, cap: int) -> tuple[float, ...]:
        """When each response of the prior's step finishes on ``replicas`` fresh replicas (its live-batch curve)."""
        engines = [ReplicaEngine(self.cost, spec.model, spec.rollout_tp, cap) for _ in range(replicas)]
        out = []
        for eng, reqs in zip(engines, assign_least_loaded(step_requests(samples), [0] * replicas)):
            eng.submit(reqs, 0.0)
            while (t := eng.next_event_s()) is not None:
                done, _ = eng.advance(t)
                out += [d for _, d, _ in done]
        return tuple(sorted(out))

    def prior(self, name: str) -> dict[str, dict[int, float]]:
        """Per stage, seconds by width, from the spec alone."""
        if name not in self._prior:
            spec = self.specs[name]
            one = replace(spec, steps=1, name=f"{spec.name}#prior")
            samples = sample_steps(one, self.seed + PRIOR_SEED_OFFSET)[0]
            tp = spec.rollout_tp
            cap = kv_capacity_tokens(
                spec.model, self.cost.gpu, tp=tp, gpu_memory_utilization=spec.gpu_memory_utilization
            )
            roll = {}
            for g in _widths(tp, self.n, tp * spec.samples_per_step):
                chains = rollout_nodes(spec, self.cost, samples, g // tp, cap)
                roll[g] = max(sum(n.duration_s for n in c) for c in chains)
            nodes = [n for c in chains for n in c]  # the widest width's replicas
            busy = max(sum(n.duration_s for n in nodes) * tp, 1e-12)
            self._rollout_needs[name] = (
                sum(n.work.compute_s for n in nodes) / busy,
                sum(n.work.memory_s for n in nodes) / busy,
            )
            self._curves[name] = self._finish_offsets(spec, samples, max(1, min(self.n, 8) // tp), cap)
            seq = (samples.prompt_len + samples.response_len).astype(np.int64)
            lp, up, sync = {}, {}, {}
            hybrid = name in self.hybrid_sync
            for g in _widths(1, self.n, 64):
                lp[g] = sum(n.duration_s for n in logprob_nodes(spec, self.cost, 0, g, seq))
                up[g] = sum(n.duration_s for n in update_nodes(spec, self.cost, 0, g, seq))
                same_node = g <= self.cost.gpus_per_node
                node = weight_sync_node(spec, self.cost, 0, g, colocated=hybrid, rollout_gpus=g, same_node=same_node)
                sync[g] = node.duration_s
            self._prior[name] = {ROLLOUT: roll, LOGPROB: lp, UPDATE: up, WEIGHT_SYNC: sync}
        return self._prior[name]

    def correction(self, name: str, history: tuple[StageTiming, ...], stage: str) -> float:
        """Median of observed over prior duration for ``stage`` over the last ``window`` steps (1 without any)."""
        table = self.prior(name)[stage]
        vals = [
            (h.end_s - h.start_s) / max(_interp(table, h.gpus), 1e-9)
            for h in history
            if h.pipeline == name and h.stage == stage and h.gpus > 0
        ][-self.window :]
        return float(np.median(vals)) if vals else 1.0

    def corrections(self, history: tuple[StageTiming, ...]) -> dict[tuple[str, str], float]:
        """:meth:`correction` of every (pipeline, stage) in one pass over ``history`` (decisions call this once).

        Consecutive decisions mostly see the same history (the same timing objects), so the last answer is kept
        and returned while the history is element for element the same objects."""
        last = self._last_corrections
        if last is not None and len(last[0]) == len(history) and all(a is b for a, b in zip(last[0], history)):
            return dict(last[1])
        obs: dict[tuple[str, str], list[float]] = {}
        for h in history:
            if h.gpus > 0 and h.pipeline in self.specs:
                table = self.prior(h.pipeline)[h.stage]
                ratio = (h.end_s - h.start_s) / max(_interp(table, h.gpus), 1e-9)
                obs.setdefault((h.pipeline, h.stage), []).append(ratio)
        out = {k: _median(v[-self.window :]) for k, v in obs.items()}
        self._last_corrections = (history, out)
        return dict(out)

    def rollout_needs(self, name: str) -> tuple[float, float]:
        """The shares of SMs and of HBM bandwidth a replica of ``name``'s rollout keeps busy on average over a step
        (its prior's work over its replicas' busy time, on the widest width the prior covers)."""
        self.prior(name)
        return self._rollout_needs[name]

    def prior_s(self, name: str, stage: str, gpus: int) -> float:
        """Seconds of ``stage`` of ``name`` on ``gpus`` GPUs by the prior alone (interpolated between widths;
        memoised, as every decision asks for the same few widths)."""
        key = (name, stage, gpus)
        if key not in self._prior_s:
            self._prior_s[key] = _interp(self.prior(name)[stage], max(1, gpus))
        return self._prior_s[key]

    def stage_s(self, name: str, history: tuple[StageTiming, ...], stage: str, gpus: int) -> float:
        """Predicted seconds of ``stage`` of the next step on ``gpus`` GPUs."""
        return self.correction(name, history, stage) * self.prior_s(name, stage, gpus)

    def _curve(self, name: str, curve: StageTiming | None) -> tuple[float, ...]:
        n = self.specs[name].samples_per_step
        self.prior(name)
        return curve.finish_offsets_s if curve is not None and len(curve.finish_offsets_s) == n else self._curves[name]

    def tail_fraction(self, name: str, live_per_replica: float, replicas: int | None = None) -> float:
        """Share of a rollout (the prior's curve) after which at most ``live_per_replica`` requests per replica
        are left on ``replicas`` replicas (the prior's width when ``None``)."""
        offs = self._curve(name, None)
        reps = replicas or max(1, min(self.n, 8) // self.specs[name].rollout_tp)
        k = len(offs) - int(live_per_replica * reps)
        return 0.0 if k <= 0 else offs[k - 1] / max(offs[-1], 1e-9)

    def time_until_outstanding_s(
        self, name: str, curve: StageTiming | None, total_s: float, outstanding: int, target: int
    ) -> float:
        """Seconds until a running rollout with ``outstanding`` requests left has ``target`` left (its curve)."""
        if outstanding <= target:
            return 0.0
        offs = self._curve(name, curve)
        n, m = self.specs[name].samples_per_step, len(offs)
        now_i = min(m, max(0, round((n - outstanding) * m / n)))
        then_i = min(m, max(0, round((n - target) * m / n)))
        now_t = offs[now_i - 1] if now_i > 0 else 0.0
        then_t = offs[then_i - 1] if then_i > 0 else 0.0
        return max(0.0, then_t - now_t) * total_s / max(offs[-1], 1e-9)

    def replica_remaining_s(self, name: str, curve: StageTiming | None, total_s: float, live: list[int]) -> list[float]:
        """Seconds until each replica of a running rollout frees its GPUs.

        The live-batch curve (the last step's, else the prior's) says how the requests still running are spread
        over time: a replica with ``l`` live requests frees when the longest of ``l`` draws from the curve's
        remaining finish times ends (the ``1 - 1/(l+1)`` quantile). Where "now" sits on the curve is found by the
        share of requests already done, which is robust to the two steps running at different speeds.

        Args:
            name: pipeline name.
            curve: the pipeline's last finished rollout, or ``None``.
            total_s: the predicted duration of this rollout (:meth:`stage_s` at its width).
            live: each replica's outstanding requests.
        """
        n = self.specs[name].samples_per_step
        offs = self._curve(name, curve)
        m = len(offs)
        scale = total_s / max(offs[-1], 1e-9)
        done = min(m, max(0, round((n - sum(live)) * m / n)))
        now_on_curve = offs[done - 1] if done > 0 else 0.0
        rest = offs[done:] or offs[-1:]
        out = []
        for count in live:
            if not count:
                out.append(0.0)
                continue
            q = rest[min(len(rest) - 1, int(len(rest) * (1.0 - 1.0 / (count + 1))))]
            out.append(max(0.05, (q - now_on_curve) * scale))
        return out
