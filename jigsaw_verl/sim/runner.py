"""Run policies on a workload side by side and derive the comparison metrics.

Every figure is measured in one process on the same sampled lengths: makespan, sample tokens (prompt +
response) trained per second summed over pipelines, the ratio to ``verl``, GPU busy fraction, modelled MFU, and
per pipeline its mean step time ((finish - arrival) / steps) and that time's inflation over the same pipeline
alone on the whole pool under ``verl-seq`` (a stock verl run with the pool to itself).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from jigsaw_verl.model.cost_model import CostModel
from jigsaw_verl.model.lengths import sample_steps
from jigsaw_verl.model.spec import WorkloadSpec
from jigsaw_verl.policy.baselines.placement import SplitSearch
from jigsaw_verl.policy.interface import Policy
from jigsaw_verl.policy.registry import BASELINES, POLICIES
from jigsaw_verl.sim.lower_bound import LowerBound, declared_staleness, lower_bound, relaxed_staleness
from jigsaw_verl.sim.simulator import SimResult, Simulator
from jigsaw_verl.sim.split_search import fastest_split_alone, fastest_split_pruned, pruned_argmin


@dataclass(frozen=True)
class PipelineMetrics:
    """One pipeline under one policy.

    Attributes:
        finish_s: when its last update finished, seconds.
        mean_step_s: (finish - arrival) / steps, seconds.
        latency_inflation: ``mean_step_s`` over the same pipeline's alone under ``verl-seq``.
    """

    finish_s: float
    mean_step_s: float
    latency_inflation: float


@dataclass(frozen=True)
class PolicyMetrics:
    """One policy's figures on one workload.

    Attributes:
        policy: policy name.
        config: the configuration it chose (the best of those it tried).
        makespan_s: when the last pipeline finished, seconds.
        tokens_per_s: prompt + response tokens of all trained samples over the makespan.
        ratio_vs_verl: ``verl``'s makespan over this one's (> 1 is faster than verl).
        gpu_busy_frac: share of GPU-time running a sub-stage (driver-side reward/advantage excluded; co-located
            sub-stages count their SM shares).
        mfu: useful model FLOPs over peak FLOPs of the pool for the makespan.
        lower_bound_s: the bound for the staleness this policy runs the pipelines with.
        reprefill_tokens: tokens re-prefilled after interrupts or migrations.
        pipelines: per pipeline metrics.
    """

    policy: str
    config: str
    makespan_s: float
    tokens_per_s: float
    ratio_vs_verl: float
    gpu_busy_frac: float
    mfu: float
    lower_bound_s: float
    reprefill_tokens: int
    pipelines: dict[str, PipelineMetrics]


@dataclass(frozen=True)
class SimulationReport:
    """Everything ``jigsaw-verl simulate`` prints and writes.

    Attributes:
        workload: the workload simulated.
        lower_bound: the on-policy bound (each pipeline as declared).
        lower_bound_relaxed: the bound for one-step-off schedules (StreamRL/AReaL-style).
        metrics: per requested policy, in request order.
        results: the raw run of each requested policy.
    """

    workload: WorkloadSpec
    lower_bound: LowerBound
    lower_bound_relaxed: LowerBound
    metrics: dict[str, PolicyMetrics]
    results: dict[str, SimResult]

    def to_json(self) -> dict:
        return {
            "workload": self.workload.name,
            "lower_bound_s": self.lower_bound.makespan_s,
            "lower_bound_relaxed_s": self.lower_bound_relaxed.makespan_s,
            "lower_bound_parts": {
                "work_s": self.lower_bound.work_s,
                "chain_s": self.lower_bound.chain_s,
                "chain_pipeline": self.lower_bound.chain_pipeline,
            },
            "policies": {
                name: {
                    "config": m.config,
                    "makespan_s": m.makespan_s,
                    "tokens_per_s": m.tokens_per_s,
                    "ratio_vs_verl": m.ratio_vs_verl,
                    "gpu_busy_frac": m.gpu_busy_frac,
                    "mfu": m.mfu,
                    "lower_bound_s": m.lower_bound_s,
                    "makespan_over_bound": m.makespan_s / m.lower_bound_s,
                    "reprefill_tokens": m.reprefill_tokens,
                    "pipelines": {
                        p: {
                            "finish_s": pm.finish_s,
                            "mean_step_s": pm.mean_step_s,
                            "latency_inflation": pm.latency_inflation,
                        }
                        for p, pm in m.pipelines.items()
                    },
                }
                for name, m in self.metrics.items()
            },
        }


def check_policy_names(names: list[str]) -> None:
    """Raise ``KeyError`` naming the first unknown policy and listing the known ones."""
    for name in names:
        POLICIES.get(name)  # raises KeyError listing the known names


class Runner:
    """Runs policy configurations on one workload, each configuration once (shared between ``verl`` and its
    forms, and with the alone references).

    Args:
        workload: the workload.
        progress: called with a line of text before each simulation.
        exhaustive: try every split of the disaggregated baselines and run every configuration of an ordered
            policy (RollMux's pool sizes); by default both are searched with the pruned search
            (:mod:`jigsaw_verl.sim.split_search`), which finds the same answer when the makespan is unimodal in
            the quantity varied, in far fewer simulations.
    """

    def __init__(
        self, workload: WorkloadSpec, progress: Callable[[str], None] | None = None, *, exhaustive: bool = False
    ):
        self.w = workload
        self.exhaustive = exhaustive
        self.split_search: SplitSearch = fastest_split_alone if exhaustive else fastest_split_pruned
        self.cost = CostModel.for_cluster(workload.cluster)
        self.progress = progress or (lambda line: None)
        self._runs: dict[tuple[str, str], SimResult] = {}
        self._configs: dict[tuple[str, str], list[Policy]] = {}

    def run_config(self, policy: Policy, workload: WorkloadSpec | None = None) -> SimResult:
        w = workload or self.w
        key = (w.name + "/" + ",".join(p.name for p in w.pipelines), policy.name, policy.config)
        if key not in self._runs:
            self._runs[key] = Simulator(w, policy, self.cost).run()
        return self._runs[key]

    def configurations(self, name: str, workload: WorkloadSpec | None = None) -> list[Policy]:
        """Every configuration of policy ``name`` worth trying on ``workload`` (the runner's by default); built once
        (a baseline's split search simulates)."""
        w = workload or self.w
        key = (w.name + "/" + ",".join(p.name for p in w.pipelines), name)
        if key not in self._configs:
            self._configs[key] = POLICIES.get(name).build(w, split_search=self.split_search)
        return self._configs[key]

    def infeasible(self, names: list[str]) -> list[str]:
        """The policies among ``names`` with no configuration that can run the workload."""
        return [name for name in names if not self.configurations(name)]

    def run_policy(self, name: str) -> SimResult:
        """The best configuration of ``name`` (smallest makespan; ties to the first tried)."""
        self.progress(f"simulating {name}")
        candidates = self.configurations(name)
        if not candidates:
            raise ValueError(f"policy {name!r} has no feasible configuration on {self.w.name}")
        if POLICIES.get(name).ordered and not self.exhaustive:
            best = self.run_config(candidates[pruned_argmin(len(candidates), self._makespan_of(candidates))])
        else:
            best = min((self.run_config(c) for c in candidates), key=lambda r: r.makespan_s)
        return replace(best, policy=name) if best.policy != name else best

    def _makespan_of(self, candidates: list[Policy]) -> Callable[[int], float]:
        return lambda i: self.run_config(candidates[i]).makespan_s

    def alone_step_s(self) -> dict[str, float]:
        """Each pipeline's mean step time alone on the whole pool under ``verl-seq``."""
        out = {}
        for p in self.w.pipelines:
            alone = replace(self.w, name=f"{self.w.name}:{p.name}-alone", pipelines=(replace(p, arrival_s=0.0),))
            (policy,) = self.configurations("verl-seq", alone)
            out[p.name] = self.run_config(policy, alone).makespan_s / p.steps
        return out

    def report(self, names: list[str]) -> SimulationReport:
        check_policy_names(names)
        lb = lower_bound(self.w, self.cost, declared_staleness(self.w))
        lb_relaxed = lower_bound(self.w, self.cost, relaxed_staleness(self.w))
        results = {name: self.run_policy(name) for name in dict.fromkeys(names)}
        verl_result = results.get("verl") or self.run_policy("verl")
        self.progress("simulating each pipeline alone (latency reference)")
        alone = self.alone_step_s()
        tokens = sum(s.tokens for p in self.w.pipelines for s in sample_steps(p, self.w.seed))
        metrics = {}
        for name, r in results.items():
            declared = declared_staleness(self.w)
            stale = {k: max(v, r.staleness[k]) for k, v in declared.items()}
            bound = lb if stale == declared else lower_bound(self.w, self.cost, stale)
            metrics[name] = summarize(r, self.w, tokens, verl_result.makespan_s, alone, bound.makespan_s)
        return SimulationReport(self.w, lb, lb_relaxed, metrics, results)


def summarize(
    r: SimResult, w: WorkloadSpec, tokens: int, verl_makespan_s: float, alone: dict[str, float], bound_s: float
) -> PolicyMetrics:
    G = w.cluster.num_gpus
    # A co-located slice counts its SM share of each GPU, so a shared GPU is never more than fully busy.
    busy = sum((s.end_s - s.start_s) * (sum(s.sm_shares) or len(s.gpus)) for s in r.slices if s.bound != "cpu")
    flops = sum(s.flops for s in r.slices)
    pipes = {}
    for p in w.pipelines:
        step = (r.finish_s[p.name] - p.arrival_s) / p.steps
        pipes[p.name] = PipelineMetrics(r.finish_s[p.name], step, step / alone[p.name])
    return PolicyMetrics(
        policy=r.policy,
        config=r.config,
        makespan_s=r.makespan_s,
        tokens_per_s=tokens / r.makespan_s,
        ratio_vs_verl=verl_makespan_s / r.makespan_s,
        gpu_busy_frac=busy / (G * r.makespan_s),
        mfu=flops / (G * w.cluster.gpu.bf16_flops * r.makespan_s),
        lower_bound_s=bound_s,
        reprefill_tokens=r.reprefill_tokens,
        pipelines=pipes,
    )


DEFAULT_POLICIES = list(BASELINES)
