"""``RolloutMigrator``: move a rollout's live requests from some replicas to others, and back.

``migrate(sources, targets=None, requests=None)``:
1. the balancer (:class:`~jigsaw_verl.integration.rollout.load_balancer.MigratingLoadBalancer`) atomically picks the
   moved requests (all live ones on the sources, or the given subset), routes their next attempt to the targets, and,
   when everything moves, takes the sources out of routing;
2. the moved requests are aborted on the sources: when everything moves, through verl's replica object
   (``RolloutReplica.abort_all_requests(reject_request=True)``, which every backend has: vLLM's fails requests that
   still arrive, SGLang's holds them until it resumes, and none arrive since the balancer no longer routes there);
   a subset by ``abort_request`` with the id the server knows them by, which verl's vLLM replica has and its
   SGLang replica has not (refused before anything moves). Each returns its tokens and log-probs so far with stop
   reason ``aborted`` (SGLang: ``abort``);
3. verl's ``FullyAsyncLLMServerClient`` (``verl/workers/rollout/llm_server.py``) resubmits each as prompt +
   tokens so far with the remaining budget; the target re-prefills (KV is recomputed, never transferred) and the
   client joins token ids and log-probs into one response, so the agent loop sees one continuous response under
   the same request id;
4. when everything moved, each source sleeps as its backend sleeps (verl's ``RolloutReplica.sleep()``: the hybrid
   engine releases weights and KV cache) and is reported free.

``restore`` puts replicas back into routing (verl's ``resume_generation()``) and, unless told not to, wakes them
(``wake_up()``). Their weights are those the backend's sleep kept: with verl's hybrid sleep (vLLM level 2, SGLang's
release of weights and KV cache, the CPU server's default) the next weight sync fills them, so the trainer restores
between rollouts without waking (the sync wakes them).

Nothing here knows which backend serves the replicas: it drives verl's replica objects
(``verl/workers/rollout/replica.py``: ``LLMServerManager.get_replicas()``, one per address), never a backend's
server directly, except to read a server's own ``telemetry()`` where it has one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from jigsaw_verl.integration.rollout.server_metrics import read_server_metrics

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


def _aborted_count(answer) -> int | None:
    """What a backend says it aborted: vLLM's replica and the CPU one answer ``aborted_count`` for everything and
    ``aborted: bool`` for one request (the CPU server counts them); SGLang's replica answers nothing (``None``)."""
    if not isinstance(answer, dict):
        return None
    if "aborted_count" in answer:
        return int(answer["aborted_count"])
    return int(answer.get("aborted", 0))


class PartialMigrationUnsupported(RuntimeError):
    """A subset of a replica's requests cannot be moved: its backend's replica has no per-request abort."""


class RolloutMigrator:
    """Migrates live requests between replicas of one rollout.

    Args:
        load_balancer: Ray handle of a :class:`MigratingLoadBalancer` actor.
        replicas: server address -> verl's replica object for it (``RolloutReplica``, as
            ``LLMServerManager.get_replicas()`` returns them, keyed by ``server_address``: the ids the balancer
            routes by).
        sleep_freed: release the sources' memory once drained (when everything moved off them).
    """

    def __init__(self, load_balancer, replicas: dict, *, sleep_freed: bool = True):
        self.lb = load_balancer
        self.replicas = dict(replicas)
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

        Raises:
            KeyError: a source or target is not one of the replicas.
            PartialMigrationUnsupported: ``requests`` was given and a source's replica has no ``abort_request``
                (verl's SGLang replica); nothing has moved.
        """
        unknown = [s for s in [*sources, *(targets or [])] if s not in self.replicas]
        if unknown:
            raise KeyError(f"unknown replicas: {unknown} (known: {sorted(self.replicas)})")
        if requests is not None:
            self._check_partial(sources)
        started = time.perf_counter()
        plan = await self.lb.plan_migration.remote(list(sources), targets, requests)
        if plan["parked"]:
            calls = [self.replicas[s].abort_all_requests(reject_request=True) for s in sources]
            moved_by = [sum(1 for src, _, _ in plan["moved"] if src == s) for s in sources]
        else:
            missing = [rid for _, rid, sid in plan["moved"] if sid is None]
            if missing:
                raise RuntimeError(
                    f"requests {missing[:3]} have no server-side id: the client must be MigratingLLMServerClient"
                )
            pairs = sorted({(s, sid) for s, _, sid in plan["moved"]})
            calls = [self.replicas[s].abort_request(sid) for s, sid in pairs]
            moved_by = [1] * len(pairs)
        answers = await asyncio.gather(*calls)
        if plan["parked"] and self.sleep_freed:
            await asyncio.gather(*[self.replicas[s].sleep() for s in sources])
        counted = [_aborted_count(a) for a in answers]
        report = MigrationReport(
            sources=tuple(sources),
            targets=tuple(plan["targets"]),
            # the backend's count where it answers one, else the requests the balancer moved off that source
            migrated_requests=sum(moved if n is None else n for n, moved in zip(counted, moved_by)),
            reprefill_tokens=sum(int(a.get("aborted_context_tokens", 0)) for a in answers if isinstance(a, dict)),
            freed=bool(plan["parked"]),
            seconds=time.perf_counter() - started,
            at_s=time.monotonic(),
        )
        self.reports.append(report)
        return report

    def _check_partial(self, sources: list[str]) -> None:
        lacking = sorted({type(self.replicas[s]).__name__ for s in sources if not _has_abort_request(self.replicas[s])})
        if lacking:
            raise PartialMigrationUnsupported(
                f"moving some of a replica's requests needs a per-request abort, and verl's {', '.join(lacking)} has "
                f"no abort_request (SGLang's server aborts all or nothing); migrate every request off the replica "
                f"(migrate(sources) without requests=...), or use actor_rollout_ref.rollout.name=vllm"
            )

    async def restore(self, replicas: list[str], *, wake: bool = True) -> None:
        """Put ``replicas`` back into routing, waking them first unless ``wake=False`` (verl's next weight sync
        wakes them). SGLang's hybrid replica refuses ``wake_up`` (it wakes in its weight update): it stays asleep
        until then."""
        if wake and self.sleep_freed:
            results = await asyncio.gather(*[self.replicas[r].wake_up() for r in replicas], return_exceptions=True)
            for r, res in zip(replicas, results):
                if isinstance(res, BaseException):
                    # verl's SGLangHttpServer.wake_up in hybrid mode: "wake_up not support rollout_mode ..."
                    if "wake_up not support" not in str(res):
                        raise res
                    logger.info("replica %s wakes at the next weight sync (%s)", r, res)
        await asyncio.gather(*[self.replicas[r].resume_generation() for r in replicas])
        await self.lb.unpark_servers.remote(list(replicas))

    async def telemetry(self) -> dict[str, dict]:
        """Per replica: ``live_requests``, ``context_tokens`` and ``routable`` from the balancer (any backend), plus
        whatever the replica's server reports: its own ``telemetry()`` where it has one (the CPU server: waiting
        requests, tokens generated, tokens/s), else (verl's vLLM and SGLang servers) its queue and KV figures from
        the Prometheus metrics at its address
        (:func:`~jigsaw_verl.integration.rollout.server_metrics.read_server_metrics`)."""
        routable = set(await self.lb.get_all_servers.remote())
        load = await self.lb.live_load.remote()

        async def server_stats(address: str, replica) -> dict:
            try:
                method = replica.server_handle.telemetry
            except AttributeError:  # verl's vLLM/SGLang servers have none: read their metrics
                return await read_server_metrics(address)
            return await method.remote()

        stats = await asyncio.gather(*[server_stats(a, r) for a, r in self.replicas.items()])
        return {
            sid: {
                "waiting_requests": 0,
                **st,
                "live_requests": load.get(sid, (0, 0))[0],
                "context_tokens": load.get(sid, (0, 0))[1],
                "routable": sid in routable,
            }
            for sid, st in zip(self.replicas, stats)
        }


def _has_abort_request(replica) -> bool:
    return callable(getattr(replica, "abort_request", None))
