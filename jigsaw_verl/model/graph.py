"""The Sub-Stage Graph: one pipeline step cut into sub-stages with their own resource behaviour.

Nodes are ``(pipeline, step, stage, sub-stage, worker)``. Rollout is cut per replica into prefill and decode
phases bucketed by the replica's live batch (:func:`~jigsaw_verl.model.rollout_engine.decode_phase`), so
imbalance between replicas and the long tail inside one are visible. Log-prob passes and updates are cut into
micro-batches. The dependencies between them depend on how a pipeline runs; the executors enforce them.

The node builders here are shared: the simulator runs exactly these nodes, and the scheduler's predictor prices
its prior step with them (lengths drawn from the spec, never the run's).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jigsaw_verl.model.cost_model import CostModel, Work
from jigsaw_verl.model.lengths import StepSamples
from jigsaw_verl.model.memory import rollout_weight_bytes, train_state_bytes
from jigsaw_verl.model.rollout_engine import Activity, ReplicaEngine, Request
from jigsaw_verl.model.spec import PipelineSpec

ROLLOUT, LOGPROB, UPDATE, WEIGHT_SYNC = "rollout", "logprob", "update", "weight_sync"
STAGES: tuple[str, ...] = (ROLLOUT, LOGPROB, UPDATE, WEIGHT_SYNC)
# Leases a live pipeline holds outside its step graph (the simulator has no such nodes): its start-up (worker and
# engine initialisation, step -1) and each validation (its own weight sync and generation, at the step it follows).
INIT, VALIDATE = "init", "validate"
OUTSIDE_STAGES: tuple[str, ...] = (INIT, VALIDATE)
# the leases inside which a pipeline's rollout engines may hold device memory (awake)
ENGINE_STAGES: tuple[str, ...] = (ROLLOUT, WEIGHT_SYNC, INIT, VALIDATE)


@dataclass(frozen=True)
class SubStage:
    """One node of the graph.

    Attributes:
        pipeline: pipeline name.
        step: step index.
        stage: one of :data:`STAGES`.
        name: sub-stage, e.g. ``prefill``, ``decode[16,64)``, ``old_logprob/mb2``, ``actor_update/mb0``.
        worker: rollout replica index; 0 for stages that run as one gang over their GPUs.
        duration_s: predicted seconds running alone.
        bound: ``compute`` | ``memory`` | ``comm`` | ``cpu`` (cpu nodes hold their GPUs but use none).
        gpus: GPUs it occupies.
        memory_bytes: resident bytes it needs per GPU.
        work: resource seconds (:class:`Work`) it needs at full speed.
        flops: useful model FLOPs (for MFU).
    """

    pipeline: str
    step: int
    stage: str
    name: str
    worker: int
    duration_s: float
    bound: str
    gpus: int
    memory_bytes: float
    work: Work
    flops: float = 0.0


def _bound(work: Work) -> str:
    return "memory" if work.memory_s > work.compute_s else "compute"


# ---- gang stages ---------------------------------------------------------------------------------------------
def micro_batches(seq_lens: np.ndarray, budget_tokens: int) -> list[np.ndarray]:
    """Split sequence indices, in order, into micro-batches of at most ``budget_tokens`` tokens (verl's dynamic
    batch size; a sequence longer than the budget gets a micro-batch of its own)."""
    out, cur, used = [], [], 0
    for i, n in enumerate(seq_lens.tolist()):
        if cur and used + n > budget_tokens:
            out.append(np.asarray(cur))
            cur, used = [], 0
        cur.append(i)
        used += n
    if cur:
        out.append(np.asarray(cur))
    return out


def logprob_nodes(
    spec: PipelineSpec,
    cost: CostModel,
    step: int,
    gpus: int,
    seq_lens: np.ndarray,
    *,
    first_index: int = 0,
    reward: bool = True,
) -> list[SubStage]:
    """Reward, then old (actor), reference and value (critic) forward passes, micro-batch by micro-batch."""
    nodes: list[SubStage] = []
    mem = train_state_bytes(spec.model, critic=spec.critic, ref_model=spec.ref_model) / gpus
    if reward:
        nodes.append(
            SubStage(spec.name, step, LOGPROB, "reward", 0, cost.reward(len(seq_lens)), "cpu", gpus, mem, Work())
        )
    if spec.param_offload:
        nodes.append(_offload_node(spec, step, LOGPROB, gpus, mem, cost.param_offload_round_trip(spec.model, gpus)))
    passes = ["old_logprob"] + (["ref_logprob"] if spec.ref_model else []) + (["values"] if spec.critic else [])
    for j, idx in enumerate(micro_batches(seq_lens, gpus * spec.logprob_tokens_per_gpu), start=first_index):
        lens = seq_lens[idx].astype(float)
        tokens, sum_sq = float(lens.sum()), float((lens * lens).sum())
        dur = cost.logprob_micro_batch(spec.model, gpus, tokens, sum_sq)
        work = cost.logprob_work(spec.model, tokens, sum_sq)
        flops = cost.forward_flops(spec.model, tokens, sum_sq)
        for name in passes:
            extra = cost.reference_stream(spec.model, gpus) if name == "ref_logprob" else 0.0
            nodes.append(
                SubStage(
                    spec.name, step, LOGPROB, f"{name}/mb{j}", 0, dur + extra, _bound(work), gpus, mem, work, flops
                )
            )
    return nodes


def _offload_node(spec: PipelineSpec, step: int, stage: str, gpus: int, mem: float, seconds: float) -> SubStage:
    """The PCIe copies of verl's FSDP offload around a stage (load before, offload after), as one node."""
    return SubStage(spec.name, step, stage, "offload", 0, seconds, "comm", gpus, mem, Work())


def update_nodes(spec: PipelineSpec, cost: CostModel, step: int, gpus: int, seq_lens: np.ndarray) -> list[SubStage]:
    """Advantage on the driver, then critic and actor updates: each mini-batch's micro-batches, its optimizer
    step folded into its last micro-batch."""
    mem = train_state_bytes(spec.model, critic=spec.critic, ref_model=spec.ref_model) / gpus
    nodes = [
        SubStage(spec.name, step, UPDATE, "advantage", 0, cost.reward(len(seq_lens)) / 4, "cpu", gpus, mem, Work())
    ]
    offload = (cost.param_offload_round_trip(spec.model, gpus) if spec.param_offload else 0.0) + (
        cost.optimizer_offload_round_trip(spec.model, gpus) if spec.optimizer_offload else 0.0
    )
    if offload > 0:
        nodes.append(_offload_node(spec, step, UPDATE, gpus, mem, offload))
    minis = np.array_split(np.arange(len(seq_lens)), max(1, min(cost.eff.optimizer_steps_per_batch, len(seq_lens))))
    opt = cost.optimizer_step(spec.model, gpus)
    for name in (["critic_update"] if spec.critic else []) + ["actor_update"]:
        j = 0
        for mini in minis:
            mbs = micro_batches(seq_lens[mini], gpus * spec.train_micro_batch_tokens)
            for m, idx in enumerate(mbs):
                lens = seq_lens[mini][idx].astype(float)
                tokens, sum_sq = float(lens.sum()), float((lens * lens).sum())
                dur = cost.train_micro_batch(spec.model, gpus, tokens, sum_sq) + (opt if m == len(mbs) - 1 else 0.0)
                work = cost.train_work(spec.model, tokens, sum_sq)
                flops = 3.0 * cost.forward_flops(spec.model, tokens, sum_sq)
                nodes.append(
                    SubStage(spec.name, step, UPDATE, f"{name}/mb{j}", 0, dur, _bound(work), gpus, mem, work, flops)
                )
                j += 1
    return nodes


def weight_sync_node(
    spec: PipelineSpec, cost: CostModel, step: int, gpus: int, *, colocated: bool, rollout_gpus: int, same_node: bool
) -> SubStage:
    """verl's hybrid-engine reshard (colocated) or a broadcast to separate rollout GPUs."""
    if colocated:
        dur = cost.weight_sync_colocated(spec.model, gpus)
    else:
        dur = cost.weight_sync_transfer(spec.model, gpus, rollout_gpus, same_node=same_node)
    if spec.param_offload:  # the sync reads the actor's parameters: loaded for it, offloaded after
        dur += cost.param_offload_round_trip(spec.model, gpus)
    return SubStage(spec.name, step, WEIGHT_SYNC, "weight_sync", 0, dur, "comm", gpus, 0.0, Work())


# ---- rollout -------------------------------------------------------------------------------------------------
def step_requests(samples: StepSamples) -> list[Request]:
    return [
        Request(samples.step, i, int(p), int(r))
        for i, (p, r) in enumerate(zip(samples.prompt_len.tolist(), samples.response_len.tolist()))
    ]


def assign_least_loaded(requests: list[Request], load: list[int]) -> list[list[Request]]:
    """verl's global load balancer: each request goes to the replica with the fewest outstanding requests
    (ties to the lowest index). ``load`` is updated in place."""
    out: list[list[Request]] = [[] for _ in load]
    for r in requests:
        i = min(range(len(load)), key=load.__getitem__)
        out[i].append(r)
        load[i] += 1
    return out


def activity_node(spec: PipelineSpec, step: int, worker: int, act: Activity, mem: float) -> SubStage:
    bound = "comm" if act.kind == "weight_load" else ("compute" if "prefill" in act.kind else _bound(act.work))
    return SubStage(
        spec.name,
        step,
        ROLLOUT,
        act.kind,
        worker,
        act.end_s - act.start_s,
        bound,
        spec.rollout_tp,
        mem,
        act.work,
        act.useful_flops,
    )


def rollout_nodes(
    spec: PipelineSpec, cost: CostModel, samples: StepSamples, replicas: int, kv_capacity_tokens: int
) -> list[list[SubStage]]:
    """Run the step's rollout on ``replicas`` fresh replicas, all requests submitted at once, and return each
    replica's chain of phase nodes (consecutive activities of the same kind merged)."""
    engines = [ReplicaEngine(cost, spec.model, spec.rollout_tp, kv_capacity_tokens) for _ in range(replicas)]
    mem = rollout_weight_bytes(spec.model) / spec.rollout_tp
    chains: list[list[SubStage]] = []
    for eng, reqs in zip(engines, assign_least_loaded(step_requests(samples), [0] * replicas)):
        eng.submit(reqs, 0.0)
        chain: list[SubStage] = []
        while (t := eng.next_event_s()) is not None:
            _, acts = eng.advance(t)
            for a in acts:
                node = activity_node(spec, samples.step, len(chains), a, mem)
                if chain and chain[-1].name == node.name:
                    prev = chain[-1]
                    node = SubStage(
                        prev.pipeline,
                        prev.step,
                        ROLLOUT,
                        prev.name,
                        prev.worker,
                        prev.duration_s + node.duration_s,
                        prev.bound,
                        prev.gpus,
                        mem,
                        prev.work + node.work,
                        prev.flops + node.flops,
                    )
                    chain[-1] = node
                else:
                    chain.append(node)
        chains.append(chain)
    return chains
