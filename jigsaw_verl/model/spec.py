"""Workload specs: a cluster and the RL pipelines that share it, loaded strictly from YAML.

The format is documented in ``jigsaw_verl/workloads/FORMAT.md``. Every problem raises :class:`SpecError`, whose
message is one line naming the file, the key and what is wrong.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from jigsaw_verl.model.catalogue import GPUS, MODELS, GPUSpec, ModelSpec
from jigsaw_verl.model.cost_model import Efficiency
from jigsaw_verl.model.memory import kv_capacity_tokens, min_train_gpus, rollout_weight_bytes

MAX_PIPELINES = 64


class SpecError(ValueError):
    """A workload file is wrong. ``str(err)`` is ``'<file>: <key>: <problem>'``."""

    def __init__(self, source: str, key: str, problem: str):
        super().__init__(f"{source}: {key}: {problem}")
        self.source, self.key, self.problem = source, key, problem


@dataclass(frozen=True, kw_only=True)
class LengthDist:
    """A token-length distribution: log-normal fitted to ``median`` and ``p99``, clipped at ``max``.

    Attributes:
        median: median length, tokens.
        p99: 99th percentile, tokens (>= median).
        max: hard cap, tokens (>= p99 is not required; values above are clipped).
        group_corr: correlation (0..1) of the log-lengths of one prompt's responses.
        drift: relative change of the median per step (0.02 = +2 % per step).
    """

    median: float
    p99: float
    max: int
    group_corr: float = 0.0
    drift: float = 0.0


@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    """The shared GPU pool.

    Attributes:
        gpu: GPU type from the catalogue.
        num_gpus: GPUs in the pool.
        gpus_per_node: GPUs that share NVLink.
        efficiency: cost-model efficiencies measured for this pool's stack, overriding the defaults of
            :class:`~jigsaw_verl.model.cost_model.Efficiency` by field name (``scripts/calibrate.py --fit`` derives
            them from one profiled verl step); empty: the defaults.
    """

    gpu: GPUSpec
    num_gpus: int
    gpus_per_node: int
    efficiency: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True, kw_only=True)
class PipelineSpec:
    """One RL training job (a verl recipe run).

    Attributes:
        name: unique within the workload.
        model: architecture, from the catalogue or given inline.
        algorithm: ``grpo`` or ``ppo`` (``ppo`` adds a critic).
        mode: ``sync`` (on-policy, stage by stage) or ``async`` (samples may lag ``max_staleness`` versions).
        max_staleness: policy versions a sample may lag (async only).
        batch_prompts: prompts per step.
        group_size: responses per prompt.
        prompt_len: prompt length distribution, tokens.
        response_len: response length distribution, tokens.
        ref_model: whether KL reference log-probs are computed.
        rollout_tp: tensor-parallel size of one rollout replica.
        rollout_elastic_tp: tensor-parallel size a rollout's long tail may move up to (a multiple of
            ``rollout_tp`` dividing ``gpus_per_node``), or ``None``: tails stay at ``rollout_tp``. Simulation only:
            verl 0.9.1 builds its replicas at one TP, and the live runtime refuses a tail move.
        train_micro_batch_tokens: tokens per GPU in one training micro-batch (verl's dynamic batch size,
            ``actor.ppo_max_token_len_per_gpu``).
        logprob_micro_batch_tokens: tokens per GPU in one log-prob micro-batch (``*.log_prob_max_token_len_per_gpu``);
            ``None``: ``train_micro_batch_tokens``, as verl defaults it.
        param_offload: the actor's FSDP parameters live on the host between stages (``actor.fsdp_config.
            param_offload``): each log-prob, update and weight sync loads them over PCIe first and offloads after.
        optimizer_offload: Adam's state lives on the host between updates (``actor.fsdp_config.optimizer_offload``):
            each update loads and offloads it over PCIe.
        gpu_memory_utilization: share of each GPU's memory the rollout engine reserves for its weights and KV cache
            (``rollout.gpu_memory_utilization``; caps the KV cache, hence how many requests run at once); ``None``:
            whatever resident state leaves.
        steps: training steps.
        arrival_s: when the job joins the pool, seconds.
        weight: how much its completion counts for a multiplexing scheduler (> 0; 1 for every job by default).
        max_latency_inflation: step-time inflation over running alone that a multiplexing scheduler should keep it
            under (>= 1), or ``None`` for no limit.
    """

    name: str
    model: ModelSpec
    algorithm: str = "grpo"
    mode: str = "sync"
    max_staleness: int = 1
    batch_prompts: int = 64
    group_size: int = 4
    prompt_len: LengthDist
    response_len: LengthDist
    ref_model: bool = True
    rollout_tp: int = 1
    rollout_elastic_tp: int | None = None
    train_micro_batch_tokens: int = 16384
    logprob_micro_batch_tokens: int | None = None
    param_offload: bool = False
    optimizer_offload: bool = False
    gpu_memory_utilization: float | None = None
    steps: int = 20
    arrival_s: float = 0.0
    weight: float = 1.0
    max_latency_inflation: float | None = None

    @property
    def critic(self) -> bool:
        return self.algorithm == "ppo"

    @property
    def logprob_tokens_per_gpu(self) -> int:
        """Tokens per GPU in one log-prob micro-batch."""
        return self.logprob_micro_batch_tokens or self.train_micro_batch_tokens

    @property
    def samples_per_step(self) -> int:
        return self.batch_prompts * self.group_size


@dataclass(frozen=True, kw_only=True)
class WorkloadSpec:
    """A cluster and the pipelines that share it.

    Attributes:
        name: workload name.
        seed: seed of all sampling.
        cluster: the pool.
        pipelines: the jobs, in file order.
        source: where it was loaded from (for messages).
    """

    name: str
    seed: int
    cluster: ClusterSpec
    pipelines: tuple[PipelineSpec, ...]
    source: str = "<dict>"

    def pipeline(self, name: str) -> PipelineSpec:
        for p in self.pipelines:
            if p.name == name:
                return p
        raise KeyError(name)


# --------------------------------------------------------------------------------------------------------------
# Loading. Each reader takes (value, key) and raises SpecError with the dotted key on any problem.

_PROMPT_KEYS = {"median", "p99", "max"}
_RESPONSE_KEYS = _PROMPT_KEYS | {"group_corr", "drift"}
_MODEL_KEYS = {"params_b", "layers", "hidden", "kv_heads", "head_dim", "heads"}
_PIPELINE_KEYS = {
    "name", "model", "algorithm", "mode", "max_staleness", "batch_prompts", "group_size", "prompt_len",
    "response_len", "ref_model", "rollout_tp", "train_micro_batch_tokens", "steps", "arrival_s",
    "weight", "max_latency_inflation", "logprob_micro_batch_tokens", "param_offload", "optimizer_offload",
    "gpu_memory_utilization", "rollout_elastic_tp",
}  # fmt: skip
_CLUSTER_KEYS = {"gpu", "num_gpus", "gpus_per_node", "efficiency"}
_TOP_KEYS = {"name", "seed", "cluster", "pipelines"}


class _Reader:
    def __init__(self, source: str):
        self.source = source

    def fail(self, key: str, problem: str) -> SpecError:
        return SpecError(self.source, key, problem)

    def mapping(self, value: Any, key: str, allowed: set[str], required: set[str] = frozenset()) -> dict:
        if not isinstance(value, dict):
            raise self.fail(key, f"expected a mapping, got {type(value).__name__}")
        for k in value:
            if k not in allowed:
                raise self.fail(f"{key}.{k}" if key else str(k), f"unknown key (allowed: {', '.join(sorted(allowed))})")
        for k in sorted(required):
            if k not in value:
                raise self.fail(f"{key}.{k}" if key else k, "required key is missing")
        return value

    def integer(self, value: Any, key: str, *, minimum: int = 1) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, f"expected an integer, got {value!r}")
        if value < minimum:
            raise self.fail(key, f"must be >= {minimum}, got {value}")
        return value

    def number(self, value: Any, key: str, *, positive: bool = True) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.fail(key, f"expected a number, got {value!r}")
        if positive and value <= 0:
            raise self.fail(key, f"must be > 0, got {value}")
        if not positive and value < 0:
            raise self.fail(key, f"must be >= 0, got {value}")
        return float(value)

    def fraction(self, value: Any, key: str) -> float:
        number = self.number(value, key)
        if number > 1:
            raise self.fail(key, f"must be in (0, 1], got {number:g}")
        return number

    def choice(self, value: Any, key: str, options: tuple[str, ...]) -> str:
        if value not in options:
            raise self.fail(key, f"must be one of {', '.join(options)}, got {value!r}")
        return value

    def boolean(self, value: Any, key: str) -> bool:
        if not isinstance(value, bool):
            raise self.fail(key, f"expected true or false, got {value!r}")
        return value

    def name(self, value: Any, key: str) -> str:
        if not isinstance(value, str) or not value.strip():
            raise self.fail(key, f"expected a non-empty string, got {value!r}")
        return value

    def lengths(self, value: Any, key: str, *, response: bool) -> LengthDist:
        raw = self.mapping(value, key, _RESPONSE_KEYS if response else _PROMPT_KEYS, {"median", "p99", "max"})
        median = self.number(raw["median"], f"{key}.median")
        p99 = self.number(raw["p99"], f"{key}.p99")
        cap = self.integer(raw["max"], f"{key}.max")
        if p99 < median:
            raise self.fail(f"{key}.p99", f"p99 ({p99:g}) is below the median ({median:g})")
        if median > cap:
            raise self.fail(f"{key}.median", f"median ({median:g}) is above max ({cap})")
        corr = self.number(raw.get("group_corr", 0.0), f"{key}.group_corr", positive=False)
        if corr > 1:
            raise self.fail(f"{key}.group_corr", f"must be in [0, 1], got {corr:g}")
        drift = raw.get("drift", 0.0)
        if isinstance(drift, bool) or not isinstance(drift, (int, float)) or not -0.5 < drift < 0.5:
            raise self.fail(f"{key}.drift", f"must be a number in (-0.5, 0.5), got {drift!r}")
        return LengthDist(median=median, p99=p99, max=cap, group_corr=corr, drift=float(drift))

    def model(self, value: Any, key: str) -> ModelSpec:
        if isinstance(value, str):
            if value not in MODELS:
                raise self.fail(key, f"unknown model {value!r} (catalogue: {', '.join(MODELS)})")
            return MODELS[value]
        raw = self.mapping(value, key, _MODEL_KEYS, _MODEL_KEYS - {"heads"})
        hidden = self.integer(raw["hidden"], f"{key}.hidden")
        head_dim = self.integer(raw["head_dim"], f"{key}.head_dim")
        return ModelSpec(
            name="custom",
            params=self.number(raw["params_b"], f"{key}.params_b") * 1e9,
            layers=self.integer(raw["layers"], f"{key}.layers"),
            hidden=hidden,
            heads=self.integer(raw.get("heads", max(1, hidden // head_dim)), f"{key}.heads"),
            kv_heads=self.integer(raw["kv_heads"], f"{key}.kv_heads"),
            head_dim=head_dim,
        )


def workload_from_dict(data: Any, source: str = "<dict>") -> WorkloadSpec:
    """Validate a parsed workload mapping and build the spec. Raises :class:`SpecError`."""
    r = _Reader(source)
    top = r.mapping(data, "", _TOP_KEYS, {"name", "cluster", "pipelines"})
    name = r.name(top["name"], "name")
    seed = r.integer(top.get("seed", 0), "seed", minimum=0)

    raw_cluster = r.mapping(top["cluster"], "cluster", _CLUSTER_KEYS, {"gpu", "num_gpus"})
    if raw_cluster["gpu"] not in GPUS:
        raise r.fail("cluster.gpu", f"unknown GPU {raw_cluster['gpu']!r} (catalogue: {', '.join(GPUS)})")
    num_gpus = r.integer(raw_cluster["num_gpus"], "cluster.num_gpus")
    per_node = r.integer(raw_cluster.get("gpus_per_node", min(8, num_gpus)), "cluster.gpus_per_node")
    if num_gpus % per_node and num_gpus > per_node:
        raise r.fail("cluster.num_gpus", f"{num_gpus} is not a whole number of nodes of {per_node} GPUs")
    efficiency = _efficiency(r, raw_cluster.get("efficiency", {}), "cluster.efficiency")
    cluster = ClusterSpec(
        gpu=GPUS[raw_cluster["gpu"]], num_gpus=num_gpus, gpus_per_node=min(per_node, num_gpus), efficiency=efficiency
    )

    raw_pipes = top["pipelines"]
    if not isinstance(raw_pipes, list) or not raw_pipes:
        raise r.fail("pipelines", "expected a non-empty list of pipelines")
    if len(raw_pipes) > MAX_PIPELINES:
        raise r.fail("pipelines", f"at most {MAX_PIPELINES} pipelines, got {len(raw_pipes)}")
    pipelines: list[PipelineSpec] = []
    seen: set[str] = set()
    for i, raw in enumerate(raw_pipes):
        pipelines.append(_pipeline(r, raw, f"pipelines[{i}]", cluster))
        if pipelines[-1].name in seen:
            raise r.fail(f"pipelines[{i}].name", f"pipeline name {pipelines[-1].name!r} is repeated")
        seen.add(pipelines[-1].name)
    return WorkloadSpec(name=name, seed=seed, cluster=cluster, pipelines=tuple(pipelines), source=source)


def _efficiency(r: _Reader, raw: Any, key: str) -> tuple[tuple[str, float], ...]:
    """Overrides of the cost model's float efficiencies: MFUs, bandwidth efficiencies and SM shares in (0, 1], the
    co-location penalty below 1, the recompute factor at least 1, the others (seconds) numbers >= 0."""
    floats = {f.name for f in fields(Efficiency) if isinstance(getattr(Efficiency(), f.name), float)}
    out = []
    for name, value in sorted(r.mapping(raw, key, floats).items()):
        fractional = name.endswith(("_mfu", "_efficiency", "_share"))
        number = r.fraction(value, f"{key}.{name}") if fractional else r.number(value, f"{key}.{name}", positive=False)
        if name == "colocation_penalty" and number >= 1 or name == "train_recompute_factor" and number < 1:
            raise r.fail(
                f"{key}.{name}", f"must be {'< 1' if name == 'colocation_penalty' else '>= 1'}, got {number:g}"
            )
        out.append((name, number))
    return tuple(out)


def _pipeline(r: _Reader, raw: Any, key: str, cluster: ClusterSpec) -> PipelineSpec:
    raw = r.mapping(raw, key, _PIPELINE_KEYS, {"name", "model", "prompt_len", "response_len"})
    mode = r.choice(raw.get("mode", "sync"), f"{key}.mode", ("sync", "async"))
    if "max_staleness" in raw and mode != "async":
        raise r.fail(f"{key}.max_staleness", "only meaningful with mode: async")
    spec = PipelineSpec(
        name=r.name(raw["name"], f"{key}.name"),
        model=r.model(raw["model"], f"{key}.model"),
        algorithm=r.choice(raw.get("algorithm", "grpo"), f"{key}.algorithm", ("grpo", "ppo")),
        mode=mode,
        max_staleness=r.integer(raw.get("max_staleness", 1), f"{key}.max_staleness"),
        batch_prompts=r.integer(raw.get("batch_prompts", 64), f"{key}.batch_prompts"),
        group_size=r.integer(raw.get("group_size", 4), f"{key}.group_size"),
        prompt_len=r.lengths(raw["prompt_len"], f"{key}.prompt_len", response=False),
        response_len=r.lengths(raw["response_len"], f"{key}.response_len", response=True),
        ref_model=r.boolean(raw.get("ref_model", True), f"{key}.ref_model"),
        rollout_tp=r.integer(raw.get("rollout_tp", 1), f"{key}.rollout_tp"),
        rollout_elastic_tp=(
            None
            if raw.get("rollout_elastic_tp") is None
            else r.integer(raw["rollout_elastic_tp"], f"{key}.rollout_elastic_tp")
        ),
        train_micro_batch_tokens=r.integer(
            raw.get("train_micro_batch_tokens", 16384), f"{key}.train_micro_batch_tokens"
        ),
        logprob_micro_batch_tokens=(
            None
            if raw.get("logprob_micro_batch_tokens") is None
            else r.integer(raw["logprob_micro_batch_tokens"], f"{key}.logprob_micro_batch_tokens")
        ),
        param_offload=r.boolean(raw.get("param_offload", False), f"{key}.param_offload"),
        optimizer_offload=r.boolean(raw.get("optimizer_offload", False), f"{key}.optimizer_offload"),
        gpu_memory_utilization=(
            None
            if raw.get("gpu_memory_utilization") is None
            else r.fraction(raw["gpu_memory_utilization"], f"{key}.gpu_memory_utilization")
        ),
        steps=r.integer(raw.get("steps", 20), f"{key}.steps"),
        arrival_s=r.number(raw.get("arrival_s", 0.0), f"{key}.arrival_s", positive=False),
        weight=r.number(raw.get("weight", 1.0), f"{key}.weight"),
        max_latency_inflation=(
            None
            if raw.get("max_latency_inflation") is None
            else r.number(raw["max_latency_inflation"], f"{key}.max_latency_inflation")
        ),
    )
    if spec.max_latency_inflation is not None and spec.max_latency_inflation < 1:
        raise r.fail(f"{key}.max_latency_inflation", f"must be >= 1, got {spec.max_latency_inflation:g}")
    _check_tp(r, spec, key, cluster)
    longest = spec.prompt_len.max + spec.response_len.max
    for field in ("train_micro_batch_tokens", "logprob_micro_batch_tokens"):
        tokens = getattr(spec, field)
        if tokens is not None and tokens < longest:
            raise r.fail(
                f"{key}.{field}", f"{tokens} cannot hold one sequence of prompt max + response max ({longest})"
            )
    _check_fits(r, spec, key, cluster)
    return spec


def _check_tp(r: _Reader, spec: PipelineSpec, key: str, cluster: ClusterSpec) -> None:
    tp, per_node = spec.rollout_tp, cluster.gpus_per_node
    if tp > per_node or per_node % tp:
        raise r.fail(f"{key}.rollout_tp", f"{tp} must divide gpus_per_node ({per_node})")
    wide = spec.rollout_elastic_tp
    if wide is not None and (wide % tp or per_node % wide or wide > cluster.num_gpus):
        raise r.fail(
            f"{key}.rollout_elastic_tp",
            f"{wide} must be a multiple of rollout_tp ({tp}) that divides gpus_per_node ({per_node}) "
            f"and fits the pool ({cluster.num_gpus} GPUs)",
        )


def _check_fits(r: _Reader, spec: PipelineSpec, key: str, cluster: ClusterSpec) -> None:
    gpu, model = cluster.gpu, spec.model
    need_gpus = min_train_gpus(model, gpu, critic=spec.critic, ref_model=spec.ref_model)
    if need_gpus > cluster.num_gpus:
        raise r.fail(
            f"{key}.model",
            f"{model.name} ({model.params / 1e9:.1f}B params) does not fit in GPU memory: its training state needs "
            f"{need_gpus} x {gpu.name}, the pool has {cluster.num_gpus}",
        )
    longest = spec.prompt_len.max + spec.response_len.max
    if kv_capacity_tokens(model, gpu, tp=spec.rollout_tp) < longest:
        raise r.fail(
            f"{key}.rollout_tp",
            f"{model.name} does not fit in GPU memory: a rollout replica of {spec.rollout_tp} x {gpu.name} cannot "
            f"hold its weights plus the KV cache of one {longest}-token sequence",
        )
    gmu = spec.gpu_memory_utilization
    if gmu is not None and kv_capacity_tokens(model, gpu, tp=spec.rollout_tp, gpu_memory_utilization=gmu) < longest:
        need = (rollout_weight_bytes(model) + longest * model.kv_bytes_per_token) / (spec.rollout_tp * gpu.memory_bytes)
        raise r.fail(
            f"{key}.gpu_memory_utilization",
            f"{gmu:g} of {spec.rollout_tp} x {gpu.name} cannot hold {model.name}'s weights plus the KV cache of one "
            f"{longest}-token sequence; at least {math.ceil(need * 100) / 100:g} would",
        )
