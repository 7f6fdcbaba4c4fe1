"""The scheduler's planning model: what its first-fit and its roll-forward both plan with.

One object per workload holds the knobs, the pipelines, the predictor, memory admission and the interference
speeds, and the rules for how wide a stage gets: a rollout its fair share of the pool in whole replicas, a
training stage its fastest predicted width. The policy (:mod:`jigsaw_verl.policy.jigsaw.lookahead`) places stages
with these rules and the roll-forward (:mod:`jigsaw_verl.policy.jigsaw.rollforward`) predicts with the same ones,
so a candidate is scored by the future the policy itself would make.
"""

from __future__ import annotations

from jigsaw_verl.model.cost_model import CostModel
from jigsaw_verl.model.graph import ROLLOUT, STAGES, UPDATE, WEIGHT_SYNC
from jigsaw_verl.model.memory import min_train_gpus
from jigsaw_verl.model.spec import WorkloadSpec
from jigsaw_verl.policy.interface import Snapshot
from jigsaw_verl.policy.jigsaw.interference import REPRESENTATIVE, InterferenceTable, ResourceManager
from jigsaw_verl.policy.jigsaw.knobs import JigsawKnobs
from jigsaw_verl.policy.jigsaw.predictor import Predictor


def active_pipelines(snap: Snapshot) -> int:
    """Pipelines that have arrived and not finished."""
    return sum(v.arrived and not v.finished for v in snap.pipelines)


def fair_share(snap: Snapshot) -> int:
    """GPUs each active pipeline gets when the pool is shared evenly (at least 1)."""
    return max(1, snap.num_gpus // max(1, active_pipelines(snap)))


class PlanningModel:
    """The scheduler's view of one workload, built once.

    Args:
        workload: the pool and pipelines.
        knobs: the scheduler's knobs.
        cost: cost model (the workload GPU's by default).
        hybrid_sync: pipelines whose weight sync is verl's hybrid-engine reshard and wake (the others broadcast);
            their rollout's idle replicas keep their GPUs until the rollout ends, unless a merge frees them.

    Attributes:
        knobs: the knobs.
        cost: the cost model.
        n: pool size.
        specs: the pipelines, by name.
        index: each pipeline's position in the workload.
        rm: memory admission.
        pred: the predictor.
        hybrid: the ``hybrid_sync`` pipelines.
        tail_share: SM share a long-tail replica keeps when a training stage joins it (the one the interference
            table says pays best).
        train_speed: speed of that training stage, as a fraction of running alone.
        alone_step_s: per pipeline, the prior's step on the whole pool.
    """

    def __init__(
        self,
        workload: WorkloadSpec,
        knobs: JigsawKnobs,
        cost: CostModel | None = None,
        *,
        hybrid_sync: frozenset[str] = frozenset(),
    ):
        self.knobs = knobs
        self.cost = cost or CostModel.for_cluster(workload.cluster)
        self.n = workload.cluster.num_gpus
        self.specs = {p.name: p for p in workload.pipelines}
        self.index = {p.name: i for i, p in enumerate(workload.pipelines)}
        self.names = [p.name for p in workload.pipelines]
        self.hybrid = hybrid_sync
        # NOTE: an async pipeline's rollouts overlap its steps (AReaL-style; the mode lets a step join the replicas of
        # the one before, this policy starts it on replicas of its own: rollout_cap). No training is placed beside
        # its tails: a newer step's rollout is due on the pipeline's GPUs, and allowing it measured worse (async
        # long-CoT 1137 -> 1264 s)
        self.refilled = frozenset(p.name for p in workload.pipelines if p.mode == "async")
        gpu = workload.cluster.gpu
        self.rm = ResourceManager(
            specs=self.specs,
            min_train={
                p.name: min_train_gpus(p.model, gpu, critic=p.critic, ref_model=p.ref_model) for p in workload.pipelines
            },
        )
        self.pred = Predictor(workload.pipelines, self.cost, self.n, workload.seed, hybrid_sync=hybrid_sync)
        table = (
            InterferenceTable.load(knobs.interference_file)
            if knobs.interference_file
            else InterferenceTable.from_cost_model(self.cost)
        )
        # Training joins a long-tail replica (memory-bound) with the SM share the table says pays best.
        self.tail_share, _, self.train_speed = table.best_share("memory", "compute")
        self._board: dict[str, tuple[float, float]] = {}
        self._best_width: dict[tuple[str, str, int], int] = {}  # best_width answers
        self.alone_step_s = {p: sum(self.pred.prior_s(p, st, self.n) for st in STAGES) for p in self.specs}

    def boarding_speeds(self, pipeline: str) -> tuple[float, float]:
        """Speeds (fractions of running alone) of ``pipeline``'s rollout started beside another pipeline's training
        gang at the tail share, and of that gang: the cost model's co-location rates at the rollout's average needs
        over a step (a rollout that starts beside training is not yet in its tail) and a training stage's."""
        if pipeline not in self._board:
            sm, bw = self.pred.rollout_needs(pipeline)
            roll = self.cost.stage_load_from_needs(min(1.0, sm), min(1.0, bw), sm_share=self.tail_share)
            train = self.cost.stage_load_from_needs(*REPRESENTATIVE["compute"], sm_share=1.0 - self.tail_share)
            self._board[pipeline] = self.cost.colocated_rates(roll, train) or (self.train_speed, self.train_speed)
        return self._board[pipeline]

    def rollout_cap(self, pipeline: str, fair: int) -> int:
        """The GPUs a rollout gets out of a ``fair`` share: whole replicas, at least one, so concurrent rollouts
        each get some width. An async pipeline runs up to ``max_staleness + 1`` steps' rollouts at once, each on
        replicas of its own: they split the share. A narrow rollout costs far fewer GPU-seconds (long-CoT,
        Qwen3-4B: one step on 1 H100 81 s, on 4 H100s 52 s x 4 = 209), and an async pipeline's throughput is
        its GPU-seconds, not one rollout's latency: over seeds 0-7 the async long-CoT workload went from 1.01x
        to 1.14x the best of StreamRL and AReaL, hetero from 1.18x to 1.23x (``scripts/knob_sweep.py``)."""
        spec = self.specs[pipeline]
        tp = spec.rollout_tp
        if pipeline in self.refilled:
            fair //= spec.max_staleness + 1
        return max(tp, fair // tp * tp)

    def best_width(self, pipeline: str, stage: str, available: int) -> int:
        """Training wider than its fastest predicted width only slows it (collectives across nodes). Memoised:
        the priors never change."""
        if stage == ROLLOUT:
            return available
        key = (pipeline, stage, available)
        if key not in self._best_width:
            table = self.pred.prior(pipeline)[stage if stage != WEIGHT_SYNC else UPDATE]
            usable = [g for g in table if g <= available]
            best = min(usable, key=lambda g: (table[g], g)) if usable else available
            self._best_width[key] = available if not usable or best == max(usable) else best
        return self._best_width[key]
