"""What runs in the simulator: replica engines and gangs, each with its pool hold and a local clock.

A task's local clock (its progress) runs at ``rate`` since the last mark ``(sim_s, local_s, rate)``; co-location
changes the rate, and the remaining work is rescaled (:meth:`Task.local`, :meth:`Task.to_sim`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from jigsaw_verl.model.graph import ROLLOUT
from jigsaw_verl.model.rollout_engine import ReplicaEngine
from jigsaw_verl.pool.holds import Hold

# Events within EPS seconds of each other happen at one moment of the simulator's clock.
EPS = 1e-9


@dataclass(eq=False)
class Task:
    """What every task has: its GPUs, its hold on them, a local clock and an event token."""

    gpus: tuple[int, ...]
    hold: Hold | None = None
    rate: float = 1.0
    marks: list = field(default_factory=list)
    token: int = 0

    def load_stamp(self) -> int:
        """Changes whenever what the task runs now (its co-location load) may have changed."""
        raise NotImplementedError

    def local(self, now: float) -> float:
        sim, local, rate = self.marks[-1]
        if sim == local and rate == 1.0:  # NOTE: exact for tasks never slowed down (all baselines)
            return now
        return local + (now - sim) * rate

    def to_sim(self, t_local: float) -> float:
        for sim, local, rate in reversed(self.marks):
            if t_local >= local or (sim, local, rate) == self.marks[0]:
                return t_local if sim == local and rate == 1.0 else sim + (t_local - local) / rate
        raise AssertionError("unreachable")


@dataclass(eq=False)
class Engine(Task):
    """A rollout replica."""

    pipeline: str = ""
    step: int = 0
    worker: int = 0
    engine: ReplicaEngine | None = None
    key: tuple = ()
    started_s: float = 0.0
    stage: str = ROLLOUT
    view_cache: Any = None  # ((engine version, step), its ReplicaView) of the last decision (Simulator._replica_view)

    def load_stamp(self) -> int:
        return self.engine.version


@dataclass(eq=False)
class Gang(Task):
    """Any other stage: its sub-stage nodes run one after another over all its GPUs."""

    pipeline: str = ""
    step: int = 0
    stage: str = ""
    nodes: deque = field(default_factory=deque)
    closed: bool = True
    key: tuple | None = None
    current: tuple | None = None  # (SubStage, local start, local end, inputs_ready, sim start); set by run()
    node_version: int = 0  # bumped with every change of ``current``

    def run(self, current: tuple | None) -> None:
        """Run ``current`` now (``None``: nothing)."""
        self.current = current
        self.node_version += 1

    def load_stamp(self) -> int:
        return self.node_version
