"""The live executor's records: grants, replica reports, migration orders, and lease slices."""

from __future__ import annotations

from dataclasses import dataclass

from jigsaw_verl.model.graph import ROLLOUT
from jigsaw_verl.pool.holds import Hold, Segment
from jigsaw_verl.pool.timeline import FORCED_LEASE, LEASE, Slice


class PoolTooSmall(ValueError):
    """A pipeline needs more slots than the group's pool has."""


class EngineMemoryRefused(ValueError):
    """A pipeline's rollout engine and pinned state do not fit beside those already living on its home slots."""


class PolicyRefused(ValueError):
    """The group's policy needs something the live runtime cannot run (asynchronous execution)."""


@dataclass(frozen=True)
class Grant:
    """Permission for ``pipeline`` to run ``stage`` of ``step`` now.

    Attributes:
        pipeline: pipeline name.
        step: step index.
        stage: one of :data:`~jigsaw_verl.model.graph.STAGES`.
        gpus: pool slots leased to it.
        sm_share: share of each slot (1 = exclusive).
        forced: granted without the policy (nothing else could ever wake the pool, or verl's post-training sync).
        start_s: when it was granted, seconds since the group started.
    """

    pipeline: str
    step: int
    stage: str
    gpus: tuple[int, ...]
    sm_share: float = 1.0
    forced: bool = False
    start_s: float = 0.0


@dataclass(frozen=True)
class ReplicaReport:
    """One rollout replica as its pipeline reports it.

    Attributes:
        rank: the replica's rank in the pipeline's rollout (its position in verl's server list).
        live: requests generating there.
        queued: requests waiting for admission there.
        context_tokens: prompt + generated tokens of its live requests.
        generated_tokens: tokens its live requests generated so far.
        kv_tokens: KV-cache tokens the replica holds for them (what its engine reserved; ``None``: their context).
    """

    rank: int
    live: int
    queued: int = 0
    context_tokens: int = 0
    generated_tokens: int = 0
    kv_tokens: int | None = None

    @property
    def kv_held_tokens(self) -> int:
        return self.context_tokens if self.kv_tokens is None else self.kv_tokens


@dataclass(frozen=True)
class MigrationOrder:
    """The policy's :class:`~jigsaw_verl.policy.interface.Migrate` in a pipeline's replica ranks: move every
    request off ``sources`` onto ``targets`` (then report :meth:`LiveExecutor.migrated`)."""

    pipeline: str
    step: int
    sources: tuple[int, ...]
    targets: tuple[int, ...]


def lease_slices(closed: list[Segment], end_s: float) -> list[Slice]:
    """Closed segments as lease slices ending at ``end_s``: one per hold, share and start, over all its slots."""
    merged: dict[tuple, list[int]] = {}
    holds: dict[int, Hold] = {}
    for seg in closed:
        holds[id(seg.hold)] = seg.hold
        merged.setdefault((id(seg.hold), seg.share, seg.since), []).append(seg.slot)
    out = []
    for (hold_id, share, since), slots in merged.items():
        h = holds[hold_id]
        shares = () if share >= 1.0 else (share,) * len(slots)
        bound = "memory" if h.stage == ROLLOUT else "compute"
        name = FORCED_LEASE if h.forced else LEASE
        out.append(
            Slice(tuple(sorted(slots)), since, end_s, h.pipeline, h.step, h.stage, name, bound, 0.0, None, shares)
        )
    return out
