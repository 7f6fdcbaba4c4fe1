"""A makespan no schedule can beat, on the simulator's own cost model.

Derivation. Every GPU offers, per second, at most one GPU-second of SM time and one GPU-second of HBM bandwidth;
a co-located pair shares them (:meth:`CostModel.colocated_rates` never hands out more) and an exclusive
sub-stage of duration ``d`` on ``g`` GPUs uses at most ``d * g`` of each. So if the work of all pipelines needs
``C`` GPU-seconds of compute and ``M`` of bandwidth (:class:`~jigsaw_verl.model.cost_model.Work`), then
``makespan >= max(C, M) / G`` on a pool of ``G`` GPUs; and for any arrival time ``a``, the work of pipelines
arriving at or after ``a`` still has to happen after ``a``.

What is counted, each term at least what any schedule spends:
- log-prob passes and updates: their FLOPs at the cost model's MFU (linear in tokens and squared lengths, so
  independent of how micro-batches are cut); prefill: prompt FLOPs at prefill MFU;
- decode (at whichever tensor-parallel size the pipeline may use costs least, :func:`rollout_tps`, since a tail
  may move onto a wider replica): FLOPs of every generated token and the bytes of every KV read (both
  independent of packing), plus the
  weight reads of the fewest replica-steps the memory allows: a replica-step serves at most ``max_num_seqs``
  sequences whose KV fits one replica's whole memory beside its weights, so there are at least
  ``max(decode tokens / max_num_seqs, context token-steps / KV capacity)`` of them (a memory-bound step costs
  the same at any batch, so fewer, fuller steps are the cheapest decode can be). Memory-bound kernels need
  ``memory_bound_sm_share`` of the SMs while they stream, which is charged as compute;
- nothing for reward, weight sync, offload, switching or fixed per-step overheads (all >= 0).

The chain term: pipeline ``p``'s step ``k`` needs its rollout (at least its slowest response decoded alone, at
batch 1 with nothing else on its replica of the fastest tensor-parallel size the pipeline may decode at, or the
step's rollout work over the whole pool) and then its update;
step ``k``'s log-prob passes cannot start before step ``k-1``'s update ends, and the update of step ``k`` not
before its rollout ends (log-prob passes may stream earlier). A rollout of step ``k`` needs weights of version
``k - s``, i.e. the update of step ``k - s - 1``, where ``s`` is the staleness the schedule runs the pipeline
with. The larger of the two terms is the bound.

The staleness is part of the question: on-policy schedules of sync pipelines (``s = 0``; verl, RollMux, and the
JigsawRL scheduler keep each pipeline's declared mode) have the *declared* bound; StreamRL- and AReaL-style
schedules run sync pipelines one step off (``s >= 1``), a different algorithm with a lower bound
(:func:`relaxed_staleness`). Each policy is held to the bound of the staleness it uses.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jigsaw_verl.model.cost_model import CostModel, Work
from jigsaw_verl.model.lengths import StepSamples, sample_steps
from jigsaw_verl.model.memory import kv_capacity_tokens
from jigsaw_verl.model.spec import PipelineSpec, WorkloadSpec

MAX_NUM_SEQS = 1024  # the replica engine's live-sequence limit
DECODE_CHUNKS = 64  # stretches of a response charged at one context each, where its TP may change


@dataclass(frozen=True)
class LowerBound:
    """The bound and its parts.

    Attributes:
        makespan_s: the bound, seconds.
        work_s: the resource term, seconds.
        chain_s: the longest pipeline chain, seconds.
        chain_pipeline: the pipeline with the longest chain.
        compute_gpu_s: SM GPU-seconds of all work.
        memory_gpu_s: HBM GPU-seconds of all work.
    """

    makespan_s: float
    work_s: float
    chain_s: float
    chain_pipeline: str
    compute_gpu_s: float
    memory_gpu_s: float


def rollout_tps(spec: PipelineSpec) -> tuple[int, ...]:
    """Every tensor-parallel size a policy may decode ``spec``'s responses at: ``rollout_tp`` and, when tails may
    move onto wider replicas, each multiple of it that divides ``rollout_elastic_tp``."""
    wide = max(spec.rollout_tp, spec.rollout_elastic_tp or 0)
    return tuple(tp for tp in range(spec.rollout_tp, wide + 1, spec.rollout_tp) if wide % tp == 0)


def _rollout_work(spec: PipelineSpec, cost: CostModel, s: StepSamples) -> Work:
    """The least decode work at any TP the pipeline may use (each resource's minimum on its own), plus prefill."""
    p = s.prompt_len.astype(float)
    r = s.response_len.astype(float)
    steps = r - 1.0  # prefill yields the first token
    tokens = float(steps.sum())
    ctx_sum = float((steps * p + steps * (steps + 1.0) / 2.0).sum())
    works = []
    for tp in rollout_tps(spec):
        cap = kv_capacity_tokens(spec.model, cost.gpu, tp=tp, gpu_memory_utilization=spec.gpu_memory_utilization)
        replica_steps = max(tokens / MAX_NUM_SEQS, ctx_sum / cap)
        works.append(cost.decode_work(cost.decode_coeffs(spec.model, tp), tp, replica_steps, tokens, ctx_sum))
    decode = Work(min(w.compute_s for w in works), min(w.memory_s for w in works))
    return decode + cost.prefill_work(spec.model, float(p.sum()), float((p * p).sum()))


def _train_work(spec: PipelineSpec, cost: CostModel, s: StepSamples) -> tuple[Work, Work]:
    seq = (s.prompt_len + s.response_len).astype(float)
    tokens, sum_sq = float(seq.sum()), float((seq * seq).sum())
    passes = 1 + spec.ref_model + spec.critic
    logprob = cost.logprob_work(spec.model, tokens, sum_sq)
    update = cost.train_work(spec.model, tokens, sum_sq)
    lp = Work(logprob.compute_s * passes, logprob.memory_s * passes)
    up = Work(update.compute_s * (1 + spec.critic), update.memory_s * (1 + spec.critic))
    return lp, up


def _alone_s(spec: PipelineSpec, cost: CostModel, s: StepSamples) -> float:
    """The slowest response of the step, decoded alone on its replica; where tails may move onto wider replicas,
    each stretch of it at the fastest TP the pipeline may use (:func:`_fastest_decode_s`)."""
    pairs = set(zip(s.prompt_len.tolist(), s.response_len.tolist()))
    tps = rollout_tps(spec)
    if len(tps) == 1:
        c = cost.decode_coeffs(spec.model, spec.rollout_tp)
        return max(
            cost.prefill(spec.model, spec.rollout_tp, p, p * p) + cost.decode_segment(c, 1, p + 1, r - 1)
            for p, r in pairs
        )
    p = np.array([p for p, _ in pairs], dtype=float)
    r = np.array([r for _, r in pairs], dtype=float)
    prefill = np.min([[cost.prefill(spec.model, tp, x, x * x) for x in p] for tp in tps], axis=0)
    return float((prefill + _fastest_decode_s(spec, cost, tps, p, r)).max())


def _fastest_decode_s(spec: PipelineSpec, cost: CostModel, tps: tuple[int, ...], p: np.ndarray, r: np.ndarray):
    """Per response, a floor on decoding ``r - 1`` tokens at batch 1 after a prompt of ``p`` when any step may
    run at any of ``tps``: the steps are cut into ``DECODE_CHUNKS`` stretches, each charged its length times the
    fastest TP's step at the stretch's first context (a step's time grows with context at every TP)."""
    steps = np.maximum(r - 1.0, 0.0)
    edges = np.linspace(0.0, 1.0, DECODE_CHUNKS + 1)
    first = np.floor(steps[:, None] * edges[None, :-1])
    length = np.floor(steps[:, None] * edges[None, 1:]) - first
    ctx = p[:, None] + 1.0 + first
    fastest = np.full(ctx.shape, np.inf)
    for tp in tps:
        c = cost.decode_coeffs(spec.model, tp)
        step = np.maximum(c.c_batch + c.c_ctx * ctx, c.m_weights + c.m_ctx * ctx) + c.overhead + c.overhead_per_seq
        fastest = np.minimum(fastest, step)
    return (fastest * length).sum(axis=1)


def _span(w: Work, gpus: int) -> float:
    return max(w.compute_s, w.memory_s) / gpus


def declared_staleness(workload: WorkloadSpec) -> dict[str, int]:
    """Staleness as the workload declares it: 0 for sync pipelines, ``max_staleness`` for async ones."""
    return {p.name: p.max_staleness if p.mode == "async" else 0 for p in workload.pipelines}


def relaxed_staleness(workload: WorkloadSpec) -> dict[str, int]:
    """Staleness of one-step-off schedules: every pipeline at least one version behind."""
    return {name: max(1, s) for name, s in declared_staleness(workload).items()}


def lower_bound(
    workload: WorkloadSpec, cost: CostModel | None = None, staleness: dict[str, int] | None = None
) -> LowerBound:
    """Compute the bound for ``workload`` (seconds from time 0) for schedules that run each pipeline with at most
    ``staleness[pipeline]`` (default: :func:`declared_staleness`)."""
    staleness = declared_staleness(workload) if staleness is None else staleness
    cost = cost or CostModel.for_cluster(workload.cluster)
    G = workload.cluster.num_gpus
    per_pipe: dict[str, Work] = {}
    chains: dict[str, float] = {}
    for spec in workload.pipelines:
        total = Work()
        r_end: list[float] = []
        t_end: list[float] = []
        s = staleness[spec.name]
        for k, samples in enumerate(sample_steps(spec, workload.seed)):
            roll = _rollout_work(spec, cost, samples)
            lp, up = _train_work(spec, cost, samples)
            total = total + roll + lp + up
            start = spec.arrival_s if k - 1 - s < 0 else max(spec.arrival_s, t_end[k - 1 - s])
            r_end.append(start + max(_alone_s(spec, cost, samples), _span(roll, G)))
            prev = t_end[k - 1] if k else spec.arrival_s
            t_end.append(max(r_end[k] + _span(up, G), prev + _span(lp + up, G)))
        per_pipe[spec.name] = total
        chains[spec.name] = t_end[-1]
    work_s = 0.0
    for a in sorted({p.arrival_s for p in workload.pipelines}):
        late = [per_pipe[p.name] for p in workload.pipelines if p.arrival_s >= a]
        work_s = max(work_s, a + max(sum(w.compute_s for w in late), sum(w.memory_s for w in late)) / G)
    chain_pipeline = max(chains, key=chains.get)
    total = Work(sum(w.compute_s for w in per_pipe.values()), sum(w.memory_s for w in per_pipe.values()))
    return LowerBound(
        makespan_s=max(work_s, chains[chain_pipeline]),
        work_s=work_s,
        chain_s=chains[chain_pipeline],
        chain_pipeline=chain_pipeline,
        compute_gpu_s=total.compute_s,
        memory_gpu_s=total.memory_s,
    )
