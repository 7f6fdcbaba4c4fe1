"""Roofline cost model: how long each sub-stage takes on the catalogue's GPUs.

Every time is the larger of a FLOP time (FLOPs over peak x an efficiency) and a byte time (bytes over HBM
bandwidth x an efficiency), plus fixed overheads where real systems have them. The efficiencies are named fields
of :class:`Efficiency`, each documented with where it comes from; the README's calibration section shows they put
verl's stage shares where public verl runs put them.

Besides wall time, each cost comes with *resource seconds* (:class:`Work`): GPU-seconds of compute (SMs) and of
memory bandwidth the piece of work needs at full speed. Co-located sub-stages share those two resources and can
never use more than one GPU-second of either per second per GPU; :mod:`jigsaw_verl.sim.lower_bound` builds the
makespan bound on exactly that fact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from jigsaw_verl.model.catalogue import GPUSpec, ModelSpec
from jigsaw_verl.model.memory import (
    OFFLOADED_OPTIMIZER_BYTES_PER_PARAM,
    OFFLOADED_PARAM_BYTES_PER_PARAM,
    TRAIN_BYTES_PER_PARAM,
    WEIGHT_BYTES_PER_PARAM,
)


@dataclass(frozen=True, kw_only=True)
class Efficiency:
    """Named efficiency factors and overheads of the cost model.

    Attributes:
        prefill_mfu: fraction of peak FLOP/s reached by prefill (large GEMMs; vLLM reaches 50-60 % on H100).
        decode_mfu: fraction of peak FLOP/s reached by a compute-bound decode step (skinny GEMMs, attention and
            sampling at batch <= 1024; vLLM serves a 7B model at roughly 10-15k tokens/s per H100).
        hbm_efficiency: fraction of peak HBM bandwidth reached by streaming weight reads (about 80 % in practice).
        attention_hbm_efficiency: fraction of peak HBM bandwidth reached by decode attention over a paged KV
            cache (block gathers; FlashAttention/FlashInfer decode kernels reach 50-70 %).
        decode_step_overhead_s: fixed time per decode step, s (scheduler, sampling, launches; vLLM with CUDA
            graphs spends 1-3 ms per step outside kernels).
        decode_overhead_per_seq_s: time per live sequence per decode step, s (vLLM's per-request CPU work each
            step: scheduling, sampling, output processing, verl's agent-loop bookkeeping; 10-30 us).
        tp_allreduce_latency_s: latency of one tensor-parallel all-reduce, s; two per layer per step.
        logprob_mfu: MFU of log-prob (forward-only) passes in verl's FSDP engine with sequence packing.
        train_mfu: MFU of forward+backward in verl's FSDP2 engine with sequence packing and dynamic batch size
            (35-40 % on H100 for 7B models), before the recompute factor.
        train_recompute_factor: FLOP multiplier of gradient checkpointing (one extra forward: 8N instead of 6N).
        interconnect_efficiency: fraction of NVLink/NIC/PCIe bandwidth reached by collectives and copies.
        micro_batch_overhead_s: fixed time per training or log-prob micro-batch, s (data movement, launches).
        optimizer_steps_per_batch: optimizer steps per training step (verl's ppo_mini_batch_size = batch / 4).
        colocated_switch_s: verl hybrid engine's per-step sleep + wake of the rollout engine (KV cache freed and
            re-allocated, CUDA graphs restored), s.
        weight_sync_overhead_s: fixed time of one weight update into the rollout engine, s.
        reward_s_per_sample: rule-based reward on the driver's CPU, s per response.
        memory_bound_sm_share: share of a GPU's SMs a memory-bound kernel needs to saturate HBM bandwidth.
        colocation_penalty: extra slowdown of each of two co-located sub-stages from cache and scheduler
            contention, on top of the share arithmetic.
    """

    prefill_mfu: float = 0.5
    decode_mfu: float = 0.35
    hbm_efficiency: float = 0.8
    attention_hbm_efficiency: float = 0.6
    decode_step_overhead_s: float = 0.002
    decode_overhead_per_seq_s: float = 2e-5
    tp_allreduce_latency_s: float = 8e-6
    logprob_mfu: float = 0.4
    train_mfu: float = 0.35
    train_recompute_factor: float = 4.0 / 3.0
    interconnect_efficiency: float = 0.7
    micro_batch_overhead_s: float = 0.03
    optimizer_steps_per_batch: int = 4
    colocated_switch_s: float = 2.0
    weight_sync_overhead_s: float = 0.5
    reward_s_per_sample: float = 2e-4
    memory_bound_sm_share: float = 0.35
    colocation_penalty: float = 0.1


@dataclass(frozen=True)
class Work:
    """Resource demand of a piece of GPU work at full speed, in GPU-seconds.

    Attributes:
        compute_s: GPU-seconds of SM time (FLOP time, or the SM share memory-bound kernels need).
        memory_s: GPU-seconds of HBM bandwidth.
    """

    compute_s: float = 0.0
    memory_s: float = 0.0

    def __add__(self, other: Work) -> Work:
        return Work(self.compute_s + other.compute_s, self.memory_s + other.memory_s)


@dataclass(frozen=True)
class DecodeCoeffs:
    """One decode step on a replica: ``max(c_batch*B + c_ctx*S, m_weights + m_ctx*S) + overhead +
    overhead_per_seq*B`` seconds, for ``B`` live sequences holding ``S`` context tokens in total."""

    c_batch: float
    c_ctx: float
    m_weights: float
    m_ctx: float
    overhead: float
    overhead_per_seq: float


def _linear_sum(a: float, b: float, lo: int, hi: int) -> float:
    """sum_{i=lo}^{hi-1} (a + b i)."""
    n = hi - lo
    return n * a + b * (lo + hi - 1) * n / 2.0 if n > 0 else 0.0


class CostModel:
    """Durations of sub-stages on one GPU type.

    Args:
        gpu: the GPU type.
        gpus_per_node: GPUs that share NVLink (collectives over more GPUs run at the NIC's speed).
        eff: efficiency factors.
    """

    def __init__(self, gpu: GPUSpec, *, gpus_per_node: int = 8, eff: Efficiency | None = None):
        self.gpu = gpu
        self.gpus_per_node = gpus_per_node
        self.eff = eff or Efficiency()

    @classmethod
    def for_cluster(cls, cluster) -> CostModel:
        """The cost model of a workload's pool (:class:`~jigsaw_verl.model.spec.ClusterSpec`): its GPU, node size
        and the efficiencies measured for it, if any."""
        return cls(cluster.gpu, gpus_per_node=cluster.gpus_per_node, eff=Efficiency(**dict(cluster.efficiency)))

    # ---- rollout ---------------------------------------------------------------------------------------------
    def decode_coeffs(self, model: ModelSpec, tp: int) -> DecodeCoeffs:
        g, e = self.gpu, self.eff
        flops = tp * g.bf16_flops * e.decode_mfu
        bw = tp * g.hbm_bytes_per_s * e.hbm_efficiency
        return DecodeCoeffs(
            c_batch=2.0 * model.params / flops,
            c_ctx=4.0 * model.layers * model.attn_width / flops,
            m_weights=WEIGHT_BYTES_PER_PARAM * model.params / bw,
            m_ctx=model.kv_bytes_per_token / (tp * g.hbm_bytes_per_s * e.attention_hbm_efficiency),
            overhead=e.decode_step_overhead_s + (2 * model.layers * e.tp_allreduce_latency_s if tp > 1 else 0.0),
            overhead_per_seq=e.decode_overhead_per_seq_s,
        )

    def decode_step(self, model: ModelSpec, tp: int, batch: int, ctx_tokens: float) -> float:
        """Seconds of one decode step with ``batch`` live sequences and ``ctx_tokens`` context in total."""
        c = self.decode_coeffs(model, tp)
        compute, memory = c.c_batch * batch + c.c_ctx * ctx_tokens, c.m_weights + c.m_ctx * ctx_tokens
        return max(compute, memory) + c.overhead + c.overhead_per_seq * batch

    def decode_segment(self, c: DecodeCoeffs, batch: int, ctx0: float, steps: int) -> float:
        """Seconds of ``steps`` decode steps at constant ``batch``, context growing from ``ctx0`` by ``batch``
        per step. Closed form: the two roofline terms are linear in the step index, so their max splits the
        range at one crossover into two arithmetic series."""
        if steps <= 0:
            return 0.0
        a, alpha = c.c_batch * batch + c.c_ctx * ctx0, c.c_ctx * batch
        m, gamma = c.m_weights + c.m_ctx * ctx0, c.m_ctx * batch
        d0, dd = a - m, alpha - gamma
        if dd == 0.0:
            split = 0 if d0 >= 0 else steps  # compute wins everywhere iff d0 >= 0
            compute_first = False
        elif dd > 0:  # compute overtakes memory from ceil(x) on
            split = min(steps, max(0, math.ceil(-d0 / dd)))
            compute_first = False
        else:  # compute wins up to floor(x)
            split = min(steps, max(0, math.floor(-d0 / dd) + 1))
            compute_first = True
        if compute_first:
            total = _linear_sum(a, alpha, 0, split) + _linear_sum(m, gamma, split, steps)
        else:
            total = _linear_sum(m, gamma, 0, split) + _linear_sum(a, alpha, split, steps)
        return total + steps * (c.overhead + c.overhead_per_seq * batch)

    def decode_steps_until(self, c: DecodeCoeffs, batch: int, ctx0: float, dt: float, max_steps: int) -> int:
        """Fewest steps (>= 1, <= ``max_steps``) whose segment lasts at least ``dt`` seconds: the step in flight
        at ``dt`` completes before anything else can happen on the replica."""
        lo, hi = 1, max_steps
        while lo < hi:
            mid = (lo + hi) // 2
            if self.decode_segment(c, batch, ctx0, mid) >= dt:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def decode_work(self, c: DecodeCoeffs, tp: int, replica_steps: float, tokens: float, ctx_sum: float) -> Work:
        """Resource seconds of decode: ``replica_steps`` steps in total producing ``tokens`` tokens that attend
        over ``ctx_sum`` context tokens in total. Linear in its arguments, so sums of parts add up."""
        flop = tp * (c.c_batch * tokens + c.c_ctx * ctx_sum)
        byte = tp * (c.m_weights * replica_steps + c.m_ctx * ctx_sum)
        return Work(max(flop, self.eff.memory_bound_sm_share * byte), byte)

    def prefill(self, model: ModelSpec, tp: int, tokens: float, sum_sq: float) -> float:
        """Seconds to prefill prompts totalling ``tokens`` with ``sum_sq`` = sum of squared prompt lengths."""
        return self._pass(model, tp, tokens, sum_sq, self.eff.prefill_mfu, 1.0) + self.eff.decode_step_overhead_s

    def prefill_work(self, model: ModelSpec, tokens: float, sum_sq: float) -> Work:
        return Work(compute_s=self.forward_flops(model, tokens, sum_sq) / (self.gpu.bf16_flops * self.eff.prefill_mfu))

    # ---- training side ---------------------------------------------------------------------------------------
    @staticmethod
    def forward_flops(model: ModelSpec, tokens: float, sum_sq: float) -> float:
        """Forward FLOPs: 2N per token plus causal attention, 2 * layers * width * len^2 per sequence."""
        return 2.0 * model.params * tokens + 2.0 * model.layers * model.attn_width * sum_sq

    def _pass(self, model: ModelSpec, gpus: int, tokens: float, sum_sq: float, mfu: float, mult: float) -> float:
        flop_t = mult * self.forward_flops(model, tokens, sum_sq) / (gpus * self.gpu.bf16_flops * mfu)
        byte_t = WEIGHT_BYTES_PER_PARAM * model.params / (gpus * self.gpu.hbm_bytes_per_s * self.eff.hbm_efficiency)
        return max(flop_t, byte_t)

    def across_nodes(self) -> CostModel:
        """This cost model for a group of GPUs that spans nodes: every collective runs at the NIC's speed."""
        return CostModel(self.gpu, gpus_per_node=1, eff=self.eff)

    def link_bytes_per_s(self, gpus: int) -> float:
        """Per-GPU bandwidth of a collective over ``gpus`` GPUs (NVLink inside a node, the NIC across)."""
        bw = self.gpu.nvlink_bytes_per_s if gpus <= self.gpus_per_node else self.gpu.nic_bytes_per_s
        return bw * self.eff.interconnect_efficiency

    def _fsdp_comm(self, model: ModelSpec, gpus: int, passes: int) -> float:
        if gpus <= 1:
            return 0.0
        shard = WEIGHT_BYTES_PER_PARAM * model.params * (gpus - 1) / gpus
        return passes * shard / self.link_bytes_per_s(gpus)

    def logprob_micro_batch(self, model: ModelSpec, gpus: int, tokens: float, sum_sq: float) -> float:
        """Seconds of one forward-only micro-batch over ``gpus`` FSDP ranks (2N FLOPs per token); the parameter
        all-gather overlaps compute."""
        compute = self._pass(model, gpus, tokens, sum_sq, self.eff.logprob_mfu, 1.0)
        return max(compute, self._fsdp_comm(model, gpus, 1)) + self.eff.micro_batch_overhead_s

    def train_micro_batch(self, model: ModelSpec, gpus: int, tokens: float, sum_sq: float) -> float:
        """Seconds of one forward+backward micro-batch (6N FLOPs per token, times the recompute factor);
        all-gathers and the gradient reduce-scatter overlap compute."""
        mult = 3.0 * self.eff.train_recompute_factor
        compute = self._pass(model, gpus, tokens, sum_sq, self.eff.train_mfu, mult)
        return max(compute, self._fsdp_comm(model, gpus, 3)) + self.eff.micro_batch_overhead_s

    def optimizer_step(self, model: ModelSpec, gpus: int) -> float:
        """Seconds of one Adam step: read and write the sharded 16-byte-per-parameter state."""
        return 2 * TRAIN_BYTES_PER_PARAM * model.params / (gpus * self.gpu.hbm_bytes_per_s * self.eff.hbm_efficiency)

    def logprob_work(self, model: ModelSpec, tokens: float, sum_sq: float) -> Work:
        return Work(compute_s=self.forward_flops(model, tokens, sum_sq) / (self.gpu.bf16_flops * self.eff.logprob_mfu))

    def train_work(self, model: ModelSpec, tokens: float, sum_sq: float) -> Work:
        mult = 3.0 * self.eff.train_recompute_factor
        return Work(
            compute_s=mult * self.forward_flops(model, tokens, sum_sq) / (self.gpu.bf16_flops * self.eff.train_mfu)
        )

    def reward(self, samples: int) -> float:
        """Seconds of rule-based reward on the driver CPU (no GPU work)."""
        return samples * self.eff.reward_s_per_sample

    # ---- moving state ----------------------------------------------------------------------------------------
    def weight_sync_colocated(self, model: ModelSpec, gpus: int) -> float:
        """Seconds of verl's hybrid-engine switch on ``gpus`` GPUs: reshard FSDP weights into the rollout engine
        (read + write the bf16 weights in HBM, gathered over the FSDP group) plus sleep/wake."""
        weights = WEIGHT_BYTES_PER_PARAM * model.params
        hbm = 2 * weights / (gpus * self.gpu.hbm_bytes_per_s * self.eff.hbm_efficiency)
        return hbm + self._fsdp_comm(model, gpus, 1) + self.eff.colocated_switch_s + self.eff.weight_sync_overhead_s

    def tail_move_load(self, model: ModelSpec, tp: int) -> float:
        """Seconds before a tail moved onto a new replica of ``tp`` GPUs can re-prefill: the current bf16 weights
        copied in over PCIe (conservatively from the host, whatever is resident: a wide engine's weights from an
        earlier step are a version old) and the engine woken with its KV pool allocated (the hybrid switch)."""
        return self.host_copy(WEIGHT_BYTES_PER_PARAM * model.params / tp) + self.eff.colocated_switch_s

    def weight_sync_transfer(self, model: ModelSpec, src_gpus: int, dst_gpus: int, *, same_node: bool) -> float:
        """Seconds to send new bf16 weights from training GPUs to separate rollout GPUs (NCCL broadcast): each
        link carries the weights once, ``min(src, dst)`` links in parallel."""
        links = max(1, min(src_gpus, dst_gpus))
        bw = (self.gpu.nvlink_bytes_per_s if same_node else self.gpu.nic_bytes_per_s) * self.eff.interconnect_efficiency
        return WEIGHT_BYTES_PER_PARAM * model.params / (links * bw) + self.eff.weight_sync_overhead_s

    def param_offload_round_trip(self, model: ModelSpec, gpus: int) -> float:
        """Seconds to load the actor's sharded fp32 parameters from the host and offload them after (verl's
        ``param_offload``, around each log-prob, update and weight sync)."""
        return 2 * self.host_copy(OFFLOADED_PARAM_BYTES_PER_PARAM * model.params / gpus)

    def optimizer_offload_round_trip(self, model: ModelSpec, gpus: int) -> float:
        """Seconds to load Adam's sharded moments from the host and offload them after (verl's
        ``optimizer_offload``, around each update)."""
        return 2 * self.host_copy(OFFLOADED_OPTIMIZER_BYTES_PER_PARAM * model.params / gpus)

    def reference_stream(self, model: ModelSpec, gpus: int) -> float:
        """Seconds one reference forward spends copying its bf16 parameter shard to the device: verl 0.9.1 always
        builds forward-only engines with FSDP CPU offload (``CPUOffload(offload_params=True)`` / FSDP2
        ``CPUOffloadPolicy``, verl/workers/engine/fsdp/transformer_impl.py), so every micro-batch streams it."""
        return self.host_copy(WEIGHT_BYTES_PER_PARAM * model.params / gpus)

    def host_copy(self, bytes_per_gpu: float) -> float:
        """Seconds to offload or onload ``bytes_per_gpu`` to/from pinned host memory over PCIe (GPUs in
        parallel)."""
        return bytes_per_gpu / (self.gpu.pcie_bytes_per_s * self.eff.interconnect_efficiency)

    # ---- co-location -----------------------------------------------------------------------------------------
    def colocated_rates(self, a: StageLoad, b: StageLoad) -> tuple[float, float] | None:
        """Speeds (fractions of running alone) of two sub-stages sharing one GPU, or ``None`` when their memory
        shares do not fit.

        Each runs at most as fast as its SM share covers the SMs it needs at full speed (a memory-bound stage
        needs only ``memory_bound_sm_share`` of the SMs to saturate HBM); if the two together would then need
        more than the whole HBM bandwidth, both slow down in proportion; both pay ``colocation_penalty``.
        Neither can exceed running alone, and together they never use more than one GPU of SMs or bandwidth.
        """
        if a.sm_share + b.sm_share > 1.0 + 1e-9 or a.mem_share + b.mem_share > 1.0 + 1e-9:
            return None
        ra, rb = (min(1.0, s.sm_share / s.sm_need) if s.sm_need > 0 else 1.0 for s in (a, b))
        bw = ra * a.bw_need + rb * b.bw_need
        if bw > 1.0:
            ra, rb = ra / bw, rb / bw
        keep = 1.0 - self.eff.colocation_penalty
        return ra * keep, rb * keep

    def stage_load(self, work: Work, duration_s: float, gpus: int, *, sm_share: float, mem_share: float) -> StageLoad:
        """The per-GPU load of a sub-stage that needs ``work`` and lasts ``duration_s`` alone on ``gpus`` GPUs."""
        busy = max(duration_s * gpus, 1e-12)
        return StageLoad(
            sm_need=min(1.0, work.compute_s / busy),
            bw_need=min(1.0, work.memory_s / busy),
            sm_share=sm_share,
            mem_share=mem_share,
        )

    @staticmethod
    def stage_load_from_needs(sm_need: float, bw_need: float, *, sm_share: float) -> StageLoad:
        """A load given directly by its per-GPU needs (the interference table's representative loads)."""
        return StageLoad(sm_need=sm_need, bw_need=bw_need, sm_share=sm_share, mem_share=0.0)


@dataclass(frozen=True, kw_only=True)
class StageLoad:
    """What a sub-stage needs from, and is given on, each of its GPUs.

    Attributes:
        sm_need: fraction of the SMs it keeps busy running alone (compute-bound stages near 1).
        bw_need: fraction of HBM bandwidth it uses running alone (memory-bound stages near 1).
        sm_share: fraction of SMs granted (Green Contexts / MPS), 0..1.
        mem_share: fraction of device memory granted, 0..1.
    """

    sm_need: float
    bw_need: float
    sm_share: float
    mem_share: float

    @property
    def memory_bound(self) -> bool:
        return self.bw_need > self.sm_need
