"""``TailMonitor``: watches a rollout's replicas and consolidates its long tail while it generates.

Every ``poll_s`` it reads each routable replica's telemetry. Once no request waits and the replicas hold fewer
than ``tail_threshold`` live requests each, the rollout is in its tail: the replicas holding the fewest live
requests are migrated away, keeping ``ceil(live / tail_threshold)`` of them (at least one), and sleep early.

In a multiplexing group the monitor also reports every poll's replicas to the group's scheduler
(``group.report_replicas``, by replica rank) and runs the migrations the scheduler's policy orders, which it plans
when another pipeline waits for the slots; each migration, ordered or the pipeline's own, is confirmed
(``group.migrated``) so the scheduler hands the freed slots on.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from dataclasses import dataclass

from jigsaw_verl.integration.rollout.migrator import RolloutMigrator


@dataclass(frozen=True)
class TailPolicy:
    """When and how far to consolidate (how often to look is the monitor's ``poll_s``).

    Attributes:
        tail_threshold: live requests per replica below which the tail starts
            (``jigsaw.migration.tail_threshold``).
    """

    tail_threshold: int

    def sources(self, live: dict[str, int], waiting: int) -> list[str]:
        """Replicas to migrate away given each routable replica's live requests (none if not in the tail)."""
        total = sum(live.values())
        if waiting or total == 0 or len(live) < 2 or max(live.values()) >= self.tail_threshold:
            return []
        keep = max(1, math.ceil(total / self.tail_threshold))
        order = sorted(live, key=lambda r: (live[r], r))
        return order[: len(live) - keep]


class TailMonitor:
    """Runs :class:`TailPolicy` and the group's orders over a rollout in a background thread between ``start`` and
    ``stop``.

    Args:
        migrator: the rollout's migrator.
        policy: the pipeline's own tail policy, or ``None`` (only the group's orders).
        group: the pipeline's side of its multiplexing group (``report_replicas`` / ``migrated`` coroutines, as
            :class:`~jigsaw_verl.integration.lease_client.StageLeases` has), or ``None``.
        addresses: the replicas' server addresses in rank order (required with ``group``).
        poll_s: seconds between telemetry reads (``jigsaw.migration.poll_s``).
    """

    def __init__(
        self,
        migrator: RolloutMigrator,
        policy: TailPolicy | None = None,
        group=None,
        addresses: list[str] | None = None,
        *,
        poll_s: float,
    ):
        if group is not None and not addresses:
            raise ValueError("a group needs the replicas' addresses in rank order")
        self.migrator, self.policy, self.group = migrator, policy, group
        self.addresses = list(addresses or [])
        self.poll_s = poll_s
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
            if self.group is not None and await self._follow_group(stats):
                stats = await self.migrator.telemetry()
            if self.policy is not None:
                live = {r: int(s["live_requests"]) for r, s in stats.items() if s["routable"]}
                waiting = sum(int(s["waiting_requests"]) for s in stats.values() if s["routable"])
                sources = self.policy.sources(live, waiting)
                if sources:
                    await self.migrator.migrate(sources)
                    if self.group is not None:
                        await self.group.migrated([self.addresses.index(a) for a in sources])
            await asyncio.sleep(self.poll_s)

    async def _follow_group(self, stats: dict[str, dict]) -> bool:
        """Report the routable replicas by rank; run the orders that come back. Returns whether any ran."""
        reports = [
            {
                "rank": rank,
                "live": int(stats[a]["live_requests"]),
                "queued": int(stats[a].get("waiting_requests", 0)),
                "context_tokens": int(stats[a].get("context_tokens", 0)),
            }
            for rank, a in enumerate(self.addresses)
            if a in stats and stats[a]["routable"]
        ]
        ran = False
        for order in await self.group.report_replicas(reports):
            sources = [self.addresses[r] for r in order["sources"]]
            targets = [self.addresses[r] for r in order["targets"]]
            if not all(stats.get(a, {}).get("routable") for a in sources + targets):
                continue  # planned on replicas that changed since; their slots free when the rollout ends
            await self.migrator.migrate(sources, targets=targets)
            await self.group.migrated(list(order["sources"]))
            ran = True
        return ran


def freed_replica_seconds(reports, until_s: float | None = None) -> float:
    """Replica-seconds the migrations in ``reports`` freed, counted up to ``until_s`` (default: now)."""
    end = time.monotonic() if until_s is None else until_s
    return sum(len(r.sources) * max(0.0, end - r.at_s) for r in reports if r.freed)
