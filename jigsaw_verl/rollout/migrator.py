"""``RolloutMigrator``: move a rollout's live requests from some replicas to the others, and back.

A migration, k replicas -> the m = (routable - k) others:
1. the sources leave routing (:class:`~jigsaw_verl.rollout.load_balancer.MigratingLoadBalancer`);
2. every live request on a source is aborted; the server returns its tokens and log-probs so far with stop
   reason ``aborted`` and refuses new work (``reject_request``);
3. verl's ``FullyAsyncLLMServerClient`` (``verl/workers/rollout/llm_server.py``) resubmits each one as prompt +
   tokens so far with the remaining budget, the balancer sends it to a target, the target re-prefills (KV is
   recomputed, never transferred) and the client joins token ids and log-probs into one response;
4. once a source has drained it sleeps (weights and KV released) and is reported free.

``restore`` wakes replicas and puts them back into routing. Nothing here knows which backend serves the
replicas: it uses the verl server surface only (``abort_all_requests``, ``resume_generation``, ``sleep``,
``wake_up`` and, where served, ``telemetry``).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class MigrationReport:
    """What one ``migrate`` did.

    Attributes:
        sources: replicas taken out of routing (server ids).
        targets: replicas still routing, which receive the migrated requests.
        migrated_requests: requests aborted on the sources (each resumes on a target).
        reprefill_tokens: prompt + tokens so far of the migrated requests: what the targets re-prefill.
        seconds: time from the call until every source drained and slept.
        at_s: when it finished (``time.monotonic()``), to account the replica-seconds it freed.
    """

    sources: tuple[str, ...]
    targets: tuple[str, ...]
    migrated_requests: int
    reprefill_tokens: int
    seconds: float
    at_s: float


class RolloutMigrator:
    """Migrates live requests between replicas of one rollout.

    Args:
        load_balancer: Ray handle of a :class:`MigratingLoadBalancer` actor.
        servers: server id -> Ray handle of that replica's server (as registered with the balancer).
        sleep_freed: release the sources' memory once drained.
    """

    def __init__(self, load_balancer, servers: dict, *, sleep_freed: bool = True):
        self.lb = load_balancer
        self.servers = dict(servers)
        self.sleep_freed = sleep_freed
        self.reports: list[MigrationReport] = []

    async def migrate(self, sources: list[str]) -> MigrationReport:
        """Move every live request off ``sources`` onto the replicas that remain in routing."""
        unknown = [s for s in sources if s not in self.servers]
        if unknown:
            raise KeyError(f"unknown replicas: {unknown} (known: {sorted(self.servers)})")
        started = time.perf_counter()
        await self.lb.park_servers.remote(list(sources))
        targets = tuple(await self.lb.get_all_servers.remote())
        aborted = await asyncio.gather(
            *[self.servers[s].abort_all_requests.remote(reject_request=True) for s in sources]
        )
        if self.sleep_freed:
            # level 1: keep a host copy, so a restore within this rollout serves the same weights
            await asyncio.gather(*[self.servers[s].sleep.remote(level=1) for s in sources])
        report = MigrationReport(
            sources=tuple(sources),
            targets=targets,
            migrated_requests=sum(int(a.get("aborted", 0)) for a in aborted),
            reprefill_tokens=sum(int(a.get("aborted_context_tokens", 0)) for a in aborted),
            seconds=time.perf_counter() - started,
            at_s=time.monotonic(),
        )
        self.reports.append(report)
        return report

    async def restore(self, replicas: list[str]) -> None:
        """Wake ``replicas`` and put them back into routing."""
        await asyncio.gather(*[self.servers[r].wake_up.remote(tags=["weights", "kv_cache"]) for r in replicas])
        await asyncio.gather(*[self.servers[r].resume_generation.remote() for r in replicas])
        await self.lb.unpark_servers.remote(list(replicas))

    async def telemetry(self) -> dict[str, dict]:
        """Per replica: whatever its server reports (live requests, tokens generated, tokens/s) and whether it
        is routable."""
        routable = set(await self.lb.get_all_servers.remote())
        stats = await asyncio.gather(*[h.telemetry.remote() for h in self.servers.values()])
        return {sid: {**st, "routable": sid in routable} for sid, st in zip(self.servers, stats)}
