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
    idle_view: Any = None  # its ReplicaView while it has nothing to do (Simulator._replica_view)


@dataclass(eq=False)
class Gang(Task):
    """Any other stage: its sub-stage nodes run one after another over all its GPUs."""

    pipeline: str = ""
    step: int = 0
    stage: str = ""
    nodes: deque = field(default_factory=deque)
    closed: bool = True
    key: tuple | None = None
    current: tuple | None = None  # (SubStage, local start, local end, inputs_ready, sim start)
