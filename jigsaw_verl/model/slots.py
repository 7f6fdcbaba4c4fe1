"""The hardware a pool slot is: a catalogue GPU, or one CPU slot of the CPU backend."""

from __future__ import annotations

from jigsaw_verl.model.catalogue import GPUS, GiB, GPUSpec

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
