"""The JigsawRL scheduler's knobs, with their defaults (the one place they are set)."""

from __future__ import annotations

from dataclasses import dataclass

from jigsaw_verl.model.graph import ROLLOUT


@dataclass(frozen=True, kw_only=True)
class JigsawKnobs:
    """Knobs of the scheduler (defaults chosen with ``scripts/bench_sim.py``).

    Attributes:
        horizon: stages per pipeline rolled forward when scoring a candidate; 0 is ``greedy``. Over the bundled
            workloads x 4 seeds (``scripts/knob_sweep.py horizon=2 horizon=4``) 2, 4 and 8 are within 1 % of
            each other in mean makespan; 8 has the best worst case (0.95x greedy, against 0.93x and 0.92x).
        max_candidates: candidate action sets scored per decision.
        placement_budget: stage placements one roll-forward may make; with many pipelines the horizon shrinks to
            ``placement_budget // pipelines`` (at least 1), and a decision scores at most ``4 * placement_budget``
            placements (at least 2 candidates), so it stays within milliseconds.
        migration: whether tails may be merged (k -> m replicas).
        colocation: whether two sub-stages may share a GPU with SM shares.
        min_gain: relative predicted gain over the greedy plan an alternative needs to be taken.
        tail_live_per_replica: a rollout is in its tail (a merge is planned and scored) below this many live
            requests per replica. 4 with ``max_live_per_target`` 8, against 1 and 2: over the bundled workloads x
            seeds 0-7 hetero 1.18x AReaL on average (was 1.13x) and async long-CoT 1.01x the best peer (0.99x),
            sync workloads unchanged but gsm8k seed 0 (0.98x greedy).
        colocate_live_per_replica: a replica with at most this many live requests (and none queued) is in its
            memory-bound tail and may host a training stage.
        wide_start: whether a candidate may start a ready rollout on every free GPU rather than its fair share
            (its tail shrinks later by migration). Off: over the bundled workloads x 4 seeds
            (``scripts/knob_sweep.py wide_start=True``) it was taken on predictions that did not hold: mean 1.096x
            greedy either way, behind greedy on 4 runs with it against 3 (gsm8k loses 1-1.5 % on three seeds).
        deferrable: stages a candidate may hold back to start them wider later.
        max_live_per_target: live requests a merge target may end up with.
        elastic_tail: whether a tail may move onto one wider replica (pipelines that set ``rollout_elastic_tp``).
        widen_live_per_replica: a rollout may move onto a wider replica once nothing is queued and at most this many
            live requests per replica are left (the move is then priced, and scored against the other candidates).
        interference_file: a profiled interference table (JSON, see
            :mod:`jigsaw_verl.policy.jigsaw.interference`); ``None`` derives it from the cost model.
    """

    horizon: int = 8
    max_candidates: int = 16
    placement_budget: int = 32
    migration: bool = True
    colocation: bool = True
    min_gain: float = 0.05
    tail_live_per_replica: float = 4.0
    colocate_live_per_replica: int = 32
    wide_start: bool = False
    deferrable: tuple[str, ...] = (ROLLOUT,)
    max_live_per_target: int = 8
    elastic_tail: bool = True
    widen_live_per_replica: float = 8.0
    interference_file: str | None = None
