"""Slot holds and SM shares: the one mechanism both executors apply plans through.

A :class:`Hold` is a running sub-stage's (simulator) or stage lease's (live) hold on pool slots, with an SM share
on each. :meth:`SlotHolds.claim` applies a :class:`~jigsaw_verl.policy.interface.StartStage`'s placement: every
slot free, or (a share below 1) held by exactly one hold of another pipeline that is not of the same kind (a
rollout replica joins a gang, a gang joins a replica; never two alike), whose share there shrinks to the rest.
It returns a :class:`Refusal` instead of raising: the simulator raises on it (the policy asked for something the
pool cannot do), the live executor waits. :meth:`SlotHolds.release` ends a hold on some or all of its slots; an
occupant left alone on a slot gets the whole slot back (share 1), as a task alone on a GPU runs at full speed.

Each share change closes a :class:`Segment` (the hold's share on one slot from ``since`` until now), which the live
executor turns into lease slices; the simulator records its slices per sub-stage with each hold's smallest share
since its last slice (:meth:`Hold.mark`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from jigsaw_verl.model.graph import ROLLOUT
from jigsaw_verl.model.topology import PoolTopology


@dataclass(eq=False)
class Hold:
    """One sub-stage's or lease's hold on its slots.

    Attributes:
        pipeline: pipeline name.
        step: step index.
        stage: stage name.
        slots: the slots it holds now (a release of some slots shrinks it).
        replica: the rollout replica it is (simulator), else ``None``.
        owner: the executor's handle for it (the simulator's task), opaque here.
        forced: granted without the policy (live).
        shares: slot -> SM share held now, (0, 1].
        low: slot -> smallest share since the last :meth:`mark` (what a slice records).
        since: slot -> when the current share began, seconds.
    """

    pipeline: str
    step: int
    stage: str
    slots: tuple[int, ...] = ()
    replica: int | None = None
    owner: object = None
    forced: bool = False
    shares: dict[int, float] = field(default_factory=dict)
    low: dict[int, float] = field(default_factory=dict)
    since: dict[int, float] = field(default_factory=dict)

    def mark(self) -> None:
        """A slice was recorded up to now: the smallest share starts again from the current one."""
        self.low = dict(self.shares)


@dataclass(frozen=True)
class Refusal:
    """Why a claim cannot be applied now."""

    reason: str


@dataclass(frozen=True)
class Segment:
    """A hold's share on one slot over ``[since, end)``, closed by a share change or a release."""

    slot: int
    hold: Hold
    share: float
    since: float


class SlotHolds:
    """The holds on each of ``num_slots`` slots, and which pipeline used each slot last."""

    def __init__(self, num_slots: int, slots_per_node: int | None = None):
        self.num_slots = num_slots
        self.slots_per_node = slots_per_node or num_slots
        self._on: list[list[Hold]] = [[] for _ in range(num_slots)]
        self.last: list[str | None] = [None] * num_slots
        self.lost: frozenset[int] = frozenset()  # slots of nodes that left the pool: never free again
        self.version = 0  # bumped by every change of who holds what at which share
        self.lease_cache: tuple | None = None  # (version, replica ids, leases) of the last snapshot (pool.snapshot)
        self.running_cache: tuple | None = None  # (version, running stages per pipeline) (pool.snapshot)
        self._holds_cache: tuple[int, tuple[Hold, ...]] | None = None
        self._free_cache: tuple[int, tuple[int, ...]] | None = None

    @property
    def topology(self) -> PoolTopology:
        return PoolTopology(self.num_slots, self.slots_per_node)

    def lose(self, slots) -> None:
        """``slots`` left the pool (their node died)."""
        self.lost = self.lost | frozenset(slots)
        self.version += 1

    def on(self, slot: int) -> list[Hold]:
        """The holds on ``slot`` now (at most two), oldest first. Do not mutate."""
        return self._on[slot]

    def free_slots(self) -> list[int]:
        """The slots no hold is on, outside lost nodes, in order (kept until the holds change: a decision reads
        them at every event, on pools of a thousand slots)."""
        if self._free_cache is None or self._free_cache[0] != self.version:
            free = tuple(g for g, held in enumerate(self._on) if not held and g not in self.lost)
            self._free_cache = (self.version, free)
        return list(self._free_cache[1])

    def holds(self) -> tuple[Hold, ...]:
        """Every hold, each once, in slot order of first appearance (kept until the holds change)."""
        if self._holds_cache is None or self._holds_cache[0] != self.version:
            seen: dict[int, Hold] = {}
            for held in self._on:
                for h in held:
                    seen.setdefault(id(h), h)
            self._holds_cache = (self.version, tuple(seen.values()))
        return self._holds_cache[1]

    def refusal(self, pipeline: str, stage: str, slots: tuple[int, ...], share: float) -> Refusal | None:
        """Why ``stage`` of ``pipeline`` cannot hold ``slots`` at ``share`` now, or ``None`` if it can."""
        if not 0.0 < share <= 1.0:
            return Refusal(f"SM share {share} is outside (0, 1]")
        for g in slots:
            if not 0 <= g < self.num_slots:
                return Refusal(f"slot {g} is not in the pool of {self.num_slots}")
            held = self._on[g]
            if not held:
                continue
            if share >= 1.0 or len(held) > 1:
                return Refusal(f"GPU {g} is busy")
            if held[0].pipeline == pipeline:
                return Refusal(f"GPU {g} is held by another stage of {pipeline}")
            if (held[0].stage == ROLLOUT) == (stage == ROLLOUT):
                what = "a replica" if stage == ROLLOUT else "a gang"
                return Refusal(f"GPU {g} already holds {what}")
        return None

    def claim(self, hold: Hold, slots: tuple[int, ...], share: float, now: float) -> Refusal | list[Segment]:
        """Give ``hold`` the ``slots`` at ``share``; returns the occupants' segments its arrival closed, or why not."""
        refused = self.refusal(hold.pipeline, hold.stage, slots, share)
        if refused is not None:
            return refused
        closed = []
        self.version += 1
        for g in slots:
            held = self._on[g]
            if held and held[0].shares[g] > 1.0 - share:  # the occupant's share shrinks to the rest
                closed.append(self._reshare(held[0], g, 1.0 - share, now))
            held.append(hold)
            hold.shares[g] = hold.low[g] = share
            hold.since[g] = now
            self.last[g] = hold.pipeline
        hold.slots = tuple(slots)
        return closed

    def release(self, hold: Hold, now: float, slots: tuple[int, ...] | None = None) -> list[Segment]:
        """End ``hold`` on ``slots`` (all of its slots by default); returns the segments that closed (its own, and
        an occupant's whose share grew back to the whole slot)."""
        slots = hold.slots if slots is None else slots
        closed = []
        self.version += 1
        for g in slots:
            self._on[g].remove(hold)
            closed.append(Segment(g, hold, hold.shares.pop(g), hold.since.pop(g)))
            hold.low.pop(g, None)
            held = self._on[g]
            if len(held) == 1 and held[0].shares[g] < 1.0:  # left alone: the whole slot again
                closed.append(self._reshare(held[0], g, 1.0, now))
        hold.slots = tuple(g for g in hold.slots if g not in slots)
        return closed

    @staticmethod
    def _reshare(hold: Hold, slot: int, share: float, now: float) -> Segment:
        ended = Segment(slot, hold, hold.shares[slot], hold.since[slot])
        hold.shares[slot], hold.since[slot] = share, now
        hold.low[slot] = min(hold.low.get(slot, share), share)
        return ended
