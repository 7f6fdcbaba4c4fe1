"""``TailMonitor``: watches a rollout's replicas and consolidates its long tail while it generates.

Every ``poll_s`` it reads each routable replica's telemetry. Once no request waits and the replicas hold fewer
than ``tail_threshold`` live requests each, the rollout is in its tail: the replicas holding the fewest live
requests are migrated away, keeping ``ceil(live / tail_threshold)`` of them (at least one), and sleep early. With
another pipeline waiting, the JigsawRL scheduler decides instead; alone, a pipeline consolidates its own tail.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from dataclasses import dataclass

from .migrator import RolloutMigrator


@dataclass(frozen=True)
class TailPolicy:
    """When and how far to consolidate.

    Attributes:
        tail_threshold: live requests per replica below which the tail starts.
        poll_s: seconds between telemetry reads.
    """

    tail_threshold: int = 4
    poll_s: float = 0.2

    def sources(self, live: dict[str, int], waiting: int) -> list[str]:
        """Replicas to migrate away given each routable replica's live requests (none if not in the tail)."""
        total = sum(live.values())
        if waiting or total == 0 or len(live) < 2 or max(live.values()) >= self.tail_threshold:
            return []
        keep = max(1, math.ceil(total / self.tail_threshold))
        order = sorted(live, key=lambda r: (live[r], r))
        return order[: len(live) - keep]


class TailMonitor:
    """Runs :class:`TailPolicy` over a rollout in a background thread between ``start`` and ``stop``.

    Args:
        migrator: the rollout's migrator.
        policy: the tail policy.
    """

    def __init__(self, migrator: RolloutMigrator, policy: TailPolicy):
        self.migrator, self.policy = migrator, policy
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="jigsaw-tail-monitor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.error is not None:
            raise RuntimeError("tail monitor failed") from self.error

    def _run(self) -> None:
        try:
            asyncio.run(self._loop())
        except BaseException as err:  # surfaced by stop()
            self.error = err

    async def _loop(self) -> None:
        while not self._stop.is_set():
            stats = await self.migrator.telemetry()
            live = {r: int(s["live_requests"]) for r, s in stats.items() if s["routable"]}
            waiting = sum(int(s["waiting_requests"]) for s in stats.values() if s["routable"])
            sources = self.policy.sources(live, waiting)
            if sources:
                await self.migrator.migrate(sources)
            await asyncio.sleep(self.policy.poll_s)


def freed_replica_seconds(reports, until_s: float | None = None) -> float:
    """Replica-seconds the migrations in ``reports`` freed, counted up to ``until_s`` (default: now)."""
    end = time.monotonic() if until_s is None else until_s
    return sum(len(r.sources) * max(0.0, end - r.at_s) for r in reports if r.freed)
