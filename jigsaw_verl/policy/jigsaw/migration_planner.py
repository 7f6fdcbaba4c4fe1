"""The tail planner: merge a rollout's long tail from k replicas onto m < k and free the rest, or move it onto
one wider replica.

A pipeline's rollout is in its tail when nothing is queued and its replicas hold few live requests each (for an
overlapping rollout, the replicas of the older steps that only drain, :func:`draining`). The
planner keeps as targets the ``m`` replicas holding the most context (the least to re-prefill elsewhere), moves
every live request of the others onto them, and prices the move:

- the targets re-prefill prompt + tokens so far of every moved request (KV is recomputed, not transferred);
- the merged replicas decode larger batches over more context, so the remaining tail runs slower by the ratio of
  the cost model's decode-step times;
- the sources free their GPUs for the time they would still have held them (the predictor's per-replica
  remaining time; for a hybrid-engine rollout, whose engines sleep together, the rollout's: an idle source moves
  nothing and frees its GPUs at no cost).

:func:`plan_migration` returns the plan with its prices, or ``None`` when the rollout is not in its tail or
merging frees nothing. Whether the freed GPU time is taken by a ready sub-stage and worth more than the cost is
the policy's call (the look-ahead scores it); :meth:`MigrationPlan.worth_it` is the local test.

The other way out of a tail speeds the critical response up instead of freeing GPUs: :func:`plan_widening` moves
every live request onto one replica of larger tensor-parallel size on the pipeline's own GPUs (and free ones) of
one node, priced the same way (re-prefill at the wide replica's rate, its weights loaded over PCIe, the remaining
tail at the ratio of the two decode steps). Consolidation and widening are two candidates of the look-ahead,
which weighs the critical response's finish against the GPU time freed for others.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from jigsaw_verl.model.cost_model import CostModel
from jigsaw_verl.model.spec import PipelineSpec
from jigsaw_verl.policy.interface import Migrate, ReplicaView, WidenTail


@dataclass(frozen=True, kw_only=True)
class MigrationPlan:
    """A priced k -> m merge.

    Attributes:
        action: the :class:`Migrate` to apply.
        freed_gpus: GPUs the sources free.
        moved_requests: live requests that move.
        reprefill_s: seconds the targets spend re-prefilling, in parallel over targets.
        slowdown: factor on the remaining tail's decode step time (>= 1).
        freed_gpu_s: GPU-seconds the sources would still have held (predicted).
        cost_gpu_s: GPU-seconds the targets spend extra (re-prefill plus the slower tail).
        delay_s: predicted delay of the rollout's end.
    """

    action: Migrate
    freed_gpus: tuple[int, ...]
    moved_requests: int
    reprefill_s: float
    slowdown: float
    freed_gpu_s: float
    cost_gpu_s: float
    delay_s: float

    def worth_it(self) -> bool:
        return self.freed_gpu_s > self.cost_gpu_s


def in_tail(replicas: list[ReplicaView], tail_live_per_replica: float) -> bool:
    """Nothing queued and few live requests per replica."""
    return (
        len(replicas) > 1
        and all(r.queued == 0 for r in replicas)
        and sum(r.live for r in replicas) <= tail_live_per_replica * len(replicas)
    )


def draining(replicas: list[ReplicaView], staleness: int) -> list[int]:
    """Indices of an overlapping rollout's replicas (AReaL-style: a step's requests join the replicas still
    generating earlier steps, which then carry the newer step) that no request can join before they drain.

    A replica still generating step ``j`` can be joined only by the rollout of a step ``k <= j + staleness``
    (version ``k - staleness`` must exist before step ``j`` is trained); once the newest step running is
    ``j + staleness`` or later, all of those have started and handed out their requests."""
    newest = max((r.step for r in replicas), default=0)
    return [i for i, r in enumerate(replicas) if r.step + staleness <= newest]


def plan_migration(
    spec: PipelineSpec,
    cost: CostModel,
    replicas: list[ReplicaView],
    remaining_s: list[float],
    *,
    tail_live_per_replica: float,
    max_live_per_target: int,
) -> MigrationPlan | None:
    """Plan merging ``replicas`` (one pipeline's, same order as ``remaining_s``) onto as few as hold at most
    ``max_live_per_target`` live requests each."""
    if not in_tail(replicas, tail_live_per_replica):
        return None
    live = sum(r.live for r in replicas)
    m = max(1, math.ceil(live / max_live_per_target))
    if m >= len(replicas):
        return None
    order = sorted(range(len(replicas)), key=lambda i: (-replicas[i].context_tokens, replicas[i].replica))
    keep, move = order[:m], order[m:]
    moved = [replicas[i] for i in move]
    tp = spec.rollout_tp
    ctx_moved = sum(r.context_tokens for r in moved)
    n_moved = sum(r.live for r in moved)
    if n_moved == 0 and sum(remaining_s[i] for i in move) <= 0:  # idle sources that free themselves anyway
        return None
    mean_ctx = ctx_moved / max(1, n_moved)
    reprefill_s = cost.prefill(spec.model, tp, ctx_moved / m, (ctx_moved / m) * mean_ctx) if n_moved else 0.0
    worst = max(replicas, key=lambda r: (r.live, r.context_tokens))
    before = cost.decode_step(spec.model, tp, max(1, worst.live), worst.context_tokens)
    after = cost.decode_step(spec.model, tp, math.ceil(live / m), sum(r.context_tokens for r in replicas) / m)
    slowdown = max(1.0, after / before)
    tail = max(remaining_s)
    delay = reprefill_s + tail * (slowdown - 1.0)
    freed_gpu_s = sum(remaining_s[i] for i in move) * tp
    return MigrationPlan(
        action=Migrate(spec.name, tuple(replicas[i].replica for i in move), tuple(replicas[i].replica for i in keep)),
        freed_gpus=tuple(g for r in moved for g in r.gpus),
        moved_requests=n_moved,
        reprefill_s=reprefill_s,
        slowdown=slowdown,
        freed_gpu_s=freed_gpu_s,
        cost_gpu_s=m * tp * delay,
        delay_s=delay,
    )


@dataclass(frozen=True, kw_only=True)
class WideningPlan:
    """A priced move of a tail onto one wider replica.

    Attributes:
        action: the :class:`WidenTail` to apply.
        freed_gpus: the sources' GPUs the wide replica does not use.
        taken_gpus: free GPUs the wide replica takes.
        end_s: predicted seconds from now until the wide replica has finished the tail.
        before_s: predicted seconds until the sources would have finished it.
    """

    action: WidenTail
    freed_gpus: tuple[int, ...]
    taken_gpus: tuple[int, ...]
    end_s: float
    before_s: float


def _groups(width: int, own: set[int], free: frozenset[int], num_gpus: int, gpus_per_node: int):
    """Aligned blocks of ``width`` GPUs on one node made of ``own`` and ``free`` GPUs, most ``own`` first."""
    blocks = []
    for lo in range(0, num_gpus - width + 1, width):
        block = tuple(range(lo, lo + width))
        if lo // gpus_per_node == (lo + width - 1) // gpus_per_node and all(g in own or g in free for g in block):
            blocks.append(block)
    return sorted(blocks, key=lambda b: (-len(own.intersection(b)), b))


def plan_widening(
    spec: PipelineSpec,
    cost: CostModel,
    replicas: list[ReplicaView],
    remaining_s: list[float],
    free: frozenset[int],
    num_gpus: int,
) -> WideningPlan | None:
    """The fastest move of ``replicas`` (one pipeline's live ones, same order as ``remaining_s``; nothing queued)
    onto one replica of a TP up to ``spec.rollout_elastic_tp``, or ``None`` when no width finishes sooner."""
    widest = max(len(r.gpus) for r in replicas)
    limit = spec.rollout_elastic_tp or 0
    if limit <= widest or any(r.queued for r in replicas):
        return None
    live = sum(r.live for r in replicas)
    ctx = sum(r.context_tokens for r in replicas)
    if live == 0:
        return None
    own = {g for r in replicas for g in r.gpus}
    worst = max(range(len(replicas)), key=lambda i: remaining_s[i])
    crit = replicas[worst]
    before = max(remaining_s)
    step_before = cost.decode_step(spec.model, len(crit.gpus), max(1, crit.live), crit.context_tokens)
    mean_ctx = ctx / live
    best: WideningPlan | None = None
    for width in range(widest + 1, limit + 1):
        if width % spec.rollout_tp or limit % width:
            continue
        for block in _groups(width, own, free, num_gpus, cost.gpus_per_node)[:1]:
            step_after = cost.decode_step(spec.model, width, live, ctx)
            load = cost.tail_move_load(spec.model, width)
            end = load + cost.prefill(spec.model, width, ctx, ctx * mean_ctx) + before * step_after / step_before
            if end < before and (best is None or end < best.end_s):
                best = WideningPlan(
                    action=WidenTail(spec.name, tuple(r.replica for r in replicas), block),
                    freed_gpus=tuple(sorted(own.difference(block))),
                    taken_gpus=tuple(g for g in block if g not in own),
                    end_s=end,
                    before_s=before,
                )
    return best
