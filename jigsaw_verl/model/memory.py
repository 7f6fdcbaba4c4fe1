"""Memory footprints: what one pipeline keeps on a GPU in each role, and whether it fits at all.

Training state follows verl's FSDP engine with mixed precision: bf16 parameters and gradients, fp32 master
weights and Adam's two moments, i.e. 2 + 2 + 4 + 4 + 4 = 16 bytes per parameter, sharded over the training GPUs.
The reference model (KL) is a bf16 copy sharded the same way. A rollout replica holds bf16 weights split over its
tensor-parallel group; the rest of its memory becomes KV cache.
"""

from __future__ import annotations

from jigsaw_verl.model.catalogue import GPUSpec, ModelSpec

TRAIN_BYTES_PER_PARAM = 16.0
WEIGHT_BYTES_PER_PARAM = 2.0
# What verl's FSDP offload moves between host and device, bytes per parameter before sharding
# (verl/utils/fsdp_utils.py offload_fsdp_model_to_cpu / offload_fsdp_optimizer): the fp32 parameters, and Adam's two
# fp32 moments.
OFFLOADED_PARAM_BYTES_PER_PARAM = 4.0
OFFLOADED_OPTIMIZER_BYTES_PER_PARAM = 8.0
# NOTE: the share of device memory kept back for activations, the CUDA context and fragmentation.
RESERVED_FRACTION = 0.1


def usable_bytes(gpu: GPUSpec) -> float:
    """Memory one GPU offers to resident state and KV cache, bytes."""
    return gpu.memory_bytes * (1.0 - RESERVED_FRACTION)


def train_state_bytes(model: ModelSpec, *, critic: bool, ref_model: bool) -> float:
    """Total resident training state of one pipeline (actor, critic, reference), bytes, before sharding."""
    total = TRAIN_BYTES_PER_PARAM * model.params
    if critic:
        total += TRAIN_BYTES_PER_PARAM * model.params
    if ref_model:
        total += WEIGHT_BYTES_PER_PARAM * model.params
    return total


def rollout_weight_bytes(model: ModelSpec) -> float:
    """bf16 weights of one rollout replica, bytes, before tensor-parallel split."""
    return WEIGHT_BYTES_PER_PARAM * model.params


def min_train_gpus(model: ModelSpec, gpu: GPUSpec, *, critic: bool, ref_model: bool, multiple: int = 1) -> int:
    """Fewest GPUs (a multiple of ``multiple``) whose memory holds the sharded training state."""
    need = train_state_bytes(model, critic=critic, ref_model=ref_model)
    n = multiple
    while need / n > usable_bytes(gpu):
        n += multiple
    return n


def kv_capacity_tokens(
    model: ModelSpec,
    gpu: GPUSpec,
    *,
    tp: int,
    other_resident_bytes: float = 0.0,
    gpu_memory_utilization: float | None = None,
) -> int:
    """KV-cache tokens one replica of ``tp`` GPUs can hold beside its weights and ``other_resident_bytes`` per GPU;
    with ``gpu_memory_utilization``, at most what that share of each device holds beside the weights (vLLM and
    SGLang size their KV pool so: ``gpu_memory_utilization`` / ``mem_fraction_static`` x device memory, minus the
    weights)."""
    free = tp * (usable_bytes(gpu) - other_resident_bytes) - rollout_weight_bytes(model)
    if gpu_memory_utilization is not None:
        free = min(free, tp * gpu_memory_utilization * gpu.memory_bytes - rollout_weight_bytes(model))
    return max(0, int(free // model.kv_bytes_per_token))
