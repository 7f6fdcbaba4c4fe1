"""``RolloutMigrator``: move a rollout's live requests from some replicas to others, and back.

``migrate(sources, targets=None, requests=None)``:
1. the balancer (:class:`~jigsaw_verl.integration.rollout.load_balancer.MigratingLoadBalancer`) atomically picks the
   moved requests (all live ones on the sources, or the given subset), routes their next attempt to the targets, and,
   when everything moves, takes the sources out of routing;
2. the moved requests are aborted on the sources (``abort_all_requests(reject_request=True)`` when everything
   moves, else ``abort_request`` by the id the server knows them by); each returns its tokens and log-probs so
   far with stop reason ``aborted``;
3. verl's ``FullyAsyncLLMServerClient`` (``verl/workers/rollout/llm_server.py``) resubmits each as prompt +
   tokens so far with the remaining budget; the target re-prefills (KV is recomputed, never transferred) and the
   client joins token ids and log-probs into one response, so the agent loop sees one continuous response under
   the same request id;
4. when everything moved, each source drains and sleeps as its backend sleeps (verl's ``sleep()``: the hybrid
   engine releases weights and KV cache) and is reported free.

``restore`` puts replicas back into routing and wakes them (verl's ``wake_up()``). Their weights are those the
backend's sleep kept: with verl's hybrid sleep (vLLM level 2, the CPU server's default) the next weight sync
fills them, so restore between rollouts (the trainer does, before verl syncs weights), not in the middle of one.

Nothing here knows which backend serves the replicas: it uses verl's server surface only
(``abort_all_requests``, ``abort_request``, ``resume_generation``, ``sleep``, ``wake_up``); ``telemetry`` adds
a server's own figures where it serves them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from jigsaw_verl.integration.rollout.server_metrics import read_vllm_metrics

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MigrationReport:
    """What one ``migrate`` did.

    Attributes:
        sources: replicas the requests moved off.
        targets: replicas that receive the moved requests.
        migrated_requests: requests aborted on the sources (each resumes on a target).
        reprefill_tokens: prompt + tokens so far of the migrated requests, where the backend reports it (the
            CPU server does); the balancer's ``migration_counters`` count it on every backend as they resume.
        freed: whether the sources left routing and slept (everything moved).
        seconds: time from the call until the moved requests were aborted (and, if freed, the sources slept).
        at_s: when it finished (``time.monotonic()``), to account the replica-seconds it freed.
    """

    sources: tuple[str, ...]
    targets: tuple[str, ...]
    migrated_requests: int
    reprefill_tokens: int
    freed: bool
    seconds: float
    at_s: float


def _aborted_count(answer: dict) -> int:
    # vLLM's abort_all_requests says aborted_count; abort_request says aborted: bool; the CPU server says both
    if "aborted_count" in answer:
        return int(answer["aborted_count"])
    return int(answer.get("aborted", 0))


class RolloutMigrator:
    """Migrates live requests between replicas of one rollout.

    Args:
        load_balancer: Ray handle of a :class:`MigratingLoadBalancer` actor.
        servers: server id -> Ray handle of that replica's server (as registered with the balancer).
        sleep_freed: release the sources' memory once drained (when everything moved off them).
    """

    def __init__(self, load_balancer, servers: dict, *, sleep_freed: bool = True):
        self.lb = load_balancer
        self.servers = dict(servers)
        self.sleep_freed = sleep_freed
        self.reports: list[MigrationReport] = []

    async def migrate(
        self, sources: list[str], targets: list[str] | None = None, requests: list[str] | None = None
    ) -> MigrationReport:
        """Move live requests off ``sources`` onto ``targets``.

        Args:
            sources: server ids to move requests off.
            targets: server ids that receive them (default: every routable replica that is not a source).
            requests: caller request ids to move (default: all live requests on the sources, after which the
                sources leave routing and sleep). With a subset the sources keep their other work and stay in
                routing.
        """
        unknown = [s for s in [*sources, *(targets or [])] if s not in self.servers]
        if unknown:
            raise KeyError(f"unknown replicas: {unknown} (known: {sorted(self.servers)})")
        started = time.perf_counter()
        plan = await self.lb.plan_migration.remote(list(sources), targets, requests)
        if plan["parked"]:
            answers = await asyncio.gather(
                *[self.servers[s].abort_all_requests.remote(reject_request=True) for s in sources]
            )
        else:
            missing = [rid for _, rid, sid in plan["moved"] if sid is None]
            if missing:
                raise RuntimeError(
                    f"requests {missing[:3]} have no server-side id: the client must be MigratingLLMServerClient"
                )
            pairs = sorted({(s, sid) for s, _, sid in plan["moved"]})
            answers = await asyncio.gather(*[self.servers[s].abort_request.remote(sid) for s, sid in pairs])
        if plan["parked"] and self.sleep_freed:
            await asyncio.gather(*[self.servers[s].sleep.remote() for s in sources])
        report = MigrationReport(
            sources=tuple(sources),
            targets=tuple(plan["targets"]),
            migrated_requests=sum(_aborted_count(a or {}) for a in answers),
            reprefill_tokens=sum(int((a or {}).get("aborted_context_tokens", 0)) for a in answers),
            freed=bool(plan["parked"]),
            seconds=time.perf_counter() - started,
            at_s=time.monotonic(),
        )
        self.reports.append(report)
        return report

    async def restore(self, replicas: list[str], *, wake: bool = True) -> None:
        """Wake ``replicas`` (unless ``wake=False``: verl's next weight sync wakes them) and put them back into
        routing."""
        if wake and self.sleep_freed:
            results = await asyncio.gather(
                *[self.servers[r].wake_up.remote() for r in replicas], return_exceptions=True
            )
            for r, res in zip(replicas, results):
                if isinstance(res, BaseException):
                    # SGLang's hybrid server refuses wake_up: it wakes in update_weights, which verl calls next
                    if "wake_up not support" not in str(res):
                        raise res
                    logger.info("replica %s wakes at the next weight sync (%s)", r, res)
        await asyncio.gather(*[self.servers[r].resume_generation.remote() for r in replicas])
        await self.lb.unpark_servers.remote(list(replicas))

    async def telemetry(self) -> dict[str, dict]:
        """Per replica: ``live_requests``, ``context_tokens`` and ``routable`` from the balancer (any backend), plus
        whatever the server's own ``telemetry()`` reports where it has one (the CPU server: waiting requests,
        tokens generated, tokens/s), else (verl's vLLM server) its queue and KV figures from the Prometheus metrics
        at its address (:func:`~jigsaw_verl.integration.rollout.server_metrics.read_vllm_metrics`)."""
        routable = set(await self.lb.get_all_servers.remote())
        load = await self.lb.live_load.remote()

        async def server_stats(address: str, handle) -> dict:
            try:
                method = handle.telemetry
            except AttributeError:  # verl's vLLM/SGLang servers: what vLLM's metrics say (nothing from SGLang's)
                return await read_vllm_metrics(address)
            return await method.remote()

        stats = await asyncio.gather(*[server_stats(a, h) for a, h in self.servers.items()])
        return {
            sid: {
                "waiting_requests": 0,
                **st,
                "live_requests": load.get(sid, (0, 0))[0],
                "context_tokens": load.get(sid, (0, 0))[1],
                "routable": sid in routable,
            }
            for sid, st in zip(self.servers, stats)
        }
