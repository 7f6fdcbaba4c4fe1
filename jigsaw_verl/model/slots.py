"""The hardware a pool slot is: a catalogue GPU, or one CPU slot of the CPU backend."""

from __future__ import annotations

from dataclasses import replace

from jigsaw_verl.model.catalogue import GPUS, GiB, GPUSpec, ModelSpec

MiB = 1024**2
# NOTE: on the CPU a slot's memory is the GPU's scaled by the model's size over this one's (4B parameters, the
# bundled workloads' Qwen3-4B): a tiny model then fills a slot as a 4B one fills the GPU.
CPU_REFERENCE_PARAMS = 4e9

# One CPU slot of the CPU backend, as the cost model sees it: rough figures of a server core (bf16 GEMMs through
# oneDNN, a share of DRAM bandwidth). They only seed the predictor; measured stage times replace them.
CPU_SLOT = GPUSpec(
    name="cpu-slot",
    bf16_flops=50e9,
    hbm_bytes_per_s=10e9,
    memory_bytes=8 * GiB,
    nvlink_bytes_per_s=5e9,
    pcie_bytes_per_s=5e9,
    nic_bytes_per_s=1e9,
)


def slot_spec(device: str, gpu_name: str | None = None) -> GPUSpec:
    """The slot hardware: the CPU slot, or a catalogue GPU (``H100-80G``...)."""
    if device == "cpu":
        return CPU_SLOT
    if gpu_name not in GPUS:
        raise ValueError(f"jigsaw.mux.gpu: {gpu_name!r} is not in the GPU catalogue ({', '.join(sorted(GPUS))})")
    return GPUS[gpu_name]


def sized_slot(slot: GPUSpec, device: str, model: ModelSpec, memory_mib: float | None, gpu_name: str | None) -> GPUSpec:
    """``slot`` with the memory the group plans with: ``memory_mib`` when given; else the GPU's own, and on the
    CPU the GPU type ``gpu_name``'s (H100-80G when not in the catalogue) scaled by ``model.params`` /
    :data:`CPU_REFERENCE_PARAMS`."""
    if memory_mib is not None:
        return replace(slot, memory_bytes=memory_mib * MiB)
    if device != "cpu":
        return slot
    gpu = GPUS.get(gpu_name or "", GPUS["H100-80G"])
    return replace(slot, memory_bytes=gpu.memory_bytes * model.params / CPU_REFERENCE_PARAMS)
