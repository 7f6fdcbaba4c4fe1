"""GPU and model catalogues: the hardware and architecture facts the cost model reads.

GPU figures are the vendors' public datasheet numbers for the SXM parts (NVIDIA H100 Tensor Core GPU datasheet,
A100 datasheet, H200 product brief): dense (non-sparse) bf16 tensor-core FLOP/s, HBM bandwidth, memory, NVLink
bandwidth per direction, PCIe bandwidth per direction, and the NIC per GPU of the usual DGX/HGX systems.
Model figures are from each model's public ``config.json`` on its model card.
"""

from __future__ import annotations

from dataclasses import dataclass

GiB = 1024**3


@dataclass(frozen=True, kw_only=True)
class GPUSpec:
    """One GPU type.

    Attributes:
        name: catalogue key, e.g. ``H100-80G``.
        bf16_flops: dense bf16 tensor-core peak, FLOP/s.
        hbm_bytes_per_s: peak HBM bandwidth, bytes/s.
        memory_bytes: device memory, bytes.
        nvlink_bytes_per_s: NVLink bandwidth per direction, bytes/s (between GPUs of one node).
        pcie_bytes_per_s: PCIe bandwidth per direction, bytes/s (host offload/onload).
        nic_bytes_per_s: network bandwidth per GPU, bytes/s (between nodes).
    """

    name: str
    bf16_flops: float
    hbm_bytes_per_s: float
    memory_bytes: float
    nvlink_bytes_per_s: float
    pcie_bytes_per_s: float
    nic_bytes_per_s: float


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A dense decoder-only transformer.

    Attributes:
        name: catalogue key or ``custom``.
        params: parameter count (all weights, embeddings included).
        layers: transformer blocks.
        hidden: residual width.
        heads: query heads.
        kv_heads: key/value heads (GQA).
        head_dim: width of one head.
    """

    name: str
    params: float
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int

    @property
    def kv_bytes_per_token(self) -> float:
        """bf16 K and V of one token over all layers, bytes."""
        return 2 * 2 * self.layers * self.kv_heads * self.head_dim

    @property
    def attn_width(self) -> int:
        """Query width (heads x head_dim); differs from ``hidden`` in Qwen3."""
        return self.heads * self.head_dim


GPUS: dict[str, GPUSpec] = {
    g.name: g
    for g in (
        GPUSpec(
            name="H100-80G",
            bf16_flops=989e12,
            hbm_bytes_per_s=3.35e12,
            memory_bytes=80 * GiB,
            nvlink_bytes_per_s=450e9,
            pcie_bytes_per_s=64e9,
            nic_bytes_per_s=50e9,
        ),
        GPUSpec(
            name="A100-80G",
            bf16_flops=312e12,
            hbm_bytes_per_s=2.039e12,
            memory_bytes=80 * GiB,
            nvlink_bytes_per_s=300e9,
            pcie_bytes_per_s=32e9,
            nic_bytes_per_s=25e9,
        ),
        GPUSpec(
            name="H200-141G",
            bf16_flops=989e12,
            hbm_bytes_per_s=4.8e12,
            memory_bytes=141e9,
            nvlink_bytes_per_s=450e9,
            pcie_bytes_per_s=64e9,
            nic_bytes_per_s=50e9,
        ),
    )
}

MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec(name="qwen3-0.6b", params=0.596e9, layers=28, hidden=1024, heads=16, kv_heads=8, head_dim=128),
        ModelSpec(name="qwen3-4b", params=4.02e9, layers=36, hidden=2560, heads=32, kv_heads=8, head_dim=128),
        ModelSpec(name="qwen3-32b", params=32.8e9, layers=64, hidden=5120, heads=64, kv_heads=8, head_dim=128),
        ModelSpec(name="qwen2.5-7b", params=7.62e9, layers=28, hidden=3584, heads=28, kv_heads=4, head_dim=128),
        ModelSpec(name="llama-3.1-8b", params=8.03e9, layers=32, hidden=4096, heads=32, kv_heads=8, head_dim=128),
        ModelSpec(
            name="r1-distill-qwen-14b", params=14.8e9, layers=48, hidden=5120, heads=40, kv_heads=8, head_dim=128
        ),
    )
}


def model_from_hf_config(config: dict, name: str = "custom") -> ModelSpec:
    """A :class:`ModelSpec` from a Hugging Face ``config.json`` of a dense decoder (Llama/Qwen2/Qwen3 layout).

    Parameters are counted from the shapes: embeddings, per layer the q/k/v/o projections (with biases when
    ``attention_bias`` or the Qwen2 layout has them), the gated MLP and two norms, the final norm, and an
    untied LM head.
    """
    missing = [
        k for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size") if k not in config
    ]
    if missing:
        raise ValueError(f"model config.json lacks {', '.join(missing)}: not a dense decoder this catalogue knows")
    hidden, layers = int(config["hidden_size"]), int(config["num_hidden_layers"])
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or hidden // heads)
    vocab, inter = int(config.get("vocab_size", 0)), int(config["intermediate_size"])
    bias = bool(config.get("attention_bias", config.get("model_type") == "qwen2"))
    attn = hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2
    if bias:
        attn += heads * head_dim + 2 * kv_heads * head_dim
    per_layer = attn + 3 * hidden * inter + 2 * hidden
    embed = vocab * hidden
    head = 0 if config.get("tie_word_embeddings", False) else vocab * hidden
    params = embed + layers * per_layer + hidden + head
    return ModelSpec(
        name=name, params=float(params), layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=head_dim
    )
