"""``MigratingLoadBalancer``: verl's global load balancer plus what migration needs to know.

Built on ``verl/workers/rollout/router.py`` (``GlobalRequestLoadBalancer``): routing is unchanged (sticky
sessions, least in-flight; hash routing under full determinism). On top of it this subclass keeps:

- **live requests** per server: each acquire records the caller's request id and the id the server sees (the
  client sends it; verl gives the server a fresh id per turn unless ``full_determinism``), each release removes
  it. The migrator reads them to choose which requests move and to abort them by their server-side id, on any
  backend (vLLM's ``abort_request`` takes the server-side id).
- **parking**: servers taken out of routing for a migration keep their handle, so they can be put back.
- **redirects**: a migrated request's next acquire goes to the least-loaded of its migration's targets, not
  wherever least in-flight routing would send it.
- **re-prefill accounting**: the context (prompt + tokens so far) of every redirected acquire, which is what the
  target re-prefills; the client reports it as a number, so no token list crosses the RPC.
- **the live batch**: the context each live request had at its last acquire (summed per server, what a replica
  holds in KV) and when each request finished (its final release: the rollout's live-batch curve for the
  scheduler's predictor).

Select it through verl's ``actor_rollout_ref.rollout.router_config_path`` (verl builds it as
``cls(servers, yaml_config)``) or pass it as ``load_balancer_cls``.
"""

from __future__ import annotations

import asyncio
import time

import ray
from verl.workers.rollout.router import GlobalRequestLoadBalancer


class MigratingLoadBalancer(GlobalRequestLoadBalancer):
    """verl's load balancer with live-request tracking, parking and migration redirects."""

    def __init__(self, servers: dict, yaml_config: dict | None = None, **kwargs):
        if isinstance(yaml_config, dict):
            kwargs.setdefault("max_cache_size", yaml_config.get("max_cache_size", 10000))
            kwargs.setdefault("full_determinism", bool(yaml_config.get("full_determinism", False)))
        elif yaml_config is not None:
            kwargs["max_cache_size"] = yaml_config
        super().__init__(servers, **kwargs)
        self._parked: dict = {}
        # server id -> live (request id, server-side request id, context tokens at acquire); ids may repeat
        self._live: dict[str, list[tuple[str, str | None, int]]] = {sid: [] for sid in servers}
        self._redirect: dict[str, tuple[str, ...]] = {}
        self.redirected_requests = 0
        self.redirected_context_tokens = 0
        self._finished: list[float] = []  # wall times of releases that ended a request (not a migrated attempt)
        # (source server, request id) -> attempts a migration cut short there, whose releases are still to come
        self._cut: dict[tuple[str, str], int] = {}

    # ---- routing ---------------------------------------------------------------------------------------------
    def require_acquire_fields(self) -> list[str]:
        return ["server_request_id", "context_tokens"]

    def require_release_fields(self) -> list[str]:
        return ["request_id"]

    def acquire_server(
        self, request_id: str, server_request_id: str | None = None, context_tokens: int | None = None
    ) -> tuple[str, ray.actor.ActorHandle]:
        """verl's sticky + least in-flight routing, except that a migrated request goes to its targets."""
        targets = [t for t in self._redirect.pop(request_id, ()) if t in self._inflight_requests]
        if targets:
            server_id = min(targets, key=lambda t: (self._inflight_requests[t], t))
            self._request_id_to_server[request_id] = server_id
            self._inflight_requests[server_id] += 1
            self.redirected_requests += 1
            self.redirected_context_tokens += int(context_tokens or 0)
            handle = self._servers[server_id]
        else:
            server_id, handle = super().acquire_server(request_id)
        self._live.setdefault(server_id, []).append((request_id, server_request_id, int(context_tokens or 0)))
        return server_id, handle

    def release_server(self, server_id: str, request_id: str | None = None) -> None:
        super().release_server(server_id, request_id)
        live = self._live.get(server_id, [])
        for i, (rid, _, _) in enumerate(live):
            if rid == request_id:
                del live[i]
                break
        # NOTE: an attempt a migration cut short resumes on a target: it did not finish. It is known by the server
        # it ran on, not by a pending redirect: verl sends this release without waiting, and an async actor may
        # run the resumed attempt's acquire (which takes the redirect) first.
        cut = self._cut.get((server_id, request_id), 0)
        if cut:
            self._cut[(server_id, request_id)] = cut - 1
        else:
            self._finished.append(time.time())

    def clear_sticky_cache(self) -> dict:
        self._redirect.clear()
        return super().clear_sticky_cache()

    # ---- migration -------------------------------------------------------------------------------------------
    def live_requests(self) -> dict[str, list[str]]:
        """Server id -> caller request ids in flight there (parked servers included)."""
        return {sid: [rid for rid, _, _ in live] for sid, live in self._live.items()}

    def plan_migration(
        self, sources: list[str], targets: list[str] | None = None, requests: list[str] | None = None
    ) -> dict:
        """Atomically decide a migration and route it: the moved requests' next acquires go to ``targets``.

        Args:
            sources: routable servers to move requests off.
            targets: routable servers, none of them a source, that receive the moved requests (default: every
                routable server that is not a source).
            requests: caller request ids to move (default: every live request on the sources). With a subset
                the sources stay in routing; without one they are parked. Requests that share a server-side id
                (verl's single-turn loop under full determinism) move together: the server cannot tell them
                apart.

        Returns:
            ``{"targets": [...], "parked": bool, "moved": [[source, request id, server-side id], ...]}``.
        """
        sources = list(sources)
        unknown = [s for s in sources if s not in self._servers]
        if unknown or not sources:
            raise KeyError(f"sources not routable (unknown or already parked): {unknown or sources}")
        if targets is None:
            targets = [s for s in self._servers if s not in sources]
        targets = list(targets)
        bad = [t for t in targets if t not in self._servers or t in sources]
        if bad:
            raise KeyError(f"targets must be routable servers that are not sources: {bad}")
        if not targets:
            raise ValueError("cannot park every server: migrated requests need somewhere to go")
        wanted = None if requests is None else set(requests)
        moved = []
        for s in sources:
            live = [(rid, sid) for rid, sid, _ in self._live.get(s, [])]
            if wanted is None:
                picked = live
            else:
                shared = {sid for rid, sid in live if rid in wanted and sid is not None}
                picked = [(rid, sid) for rid, sid in live if rid in wanted or sid in shared]
            moved += [[s, rid, sid] for rid, sid in picked]
        for s, rid, _ in moved:
            self._redirect[rid] = tuple(targets)
            self._cut[(s, rid)] = self._cut.get((s, rid), 0) + 1
            self._request_id_to_server.pop(rid, None)
        parked = wanted is None
        if parked:
            for s in sources:
                self._parked[s] = self._servers[s]
            self.remove_servers(sources)
        return {"targets": targets, "parked": parked, "moved": moved}

    def unpark_servers(self, server_ids: list[str]) -> None:
        """Put parked servers back into routing."""
        missing = [s for s in server_ids if s not in self._parked]
        if missing:
            raise KeyError(f"not parked: {missing}")
        self.add_servers({s: self._parked.pop(s) for s in server_ids})

    def parked_servers(self) -> list[str]:
        return list(self._parked)

    def live_load(self) -> dict[str, tuple[int, int]]:
        """Server id -> (requests live there, their context tokens at their last acquire), read at one instant."""
        return {sid: (len(live), sum(ctx for _, _, ctx in live)) for sid, live in self._live.items()}

    async def take_finish_times(self, settle_s: float = 5.0) -> list[float]:
        """Wall times at which requests finished since the previous call, sorted; clears them. The release of an
        attempt a migration cut short (from the server it was moved off, whenever it arrives) does not count.

        verl's client sends its release without waiting for it, so a caller that has seen every request return may
        ask before the last releases arrive: this waits, up to ``settle_s``, until no request is live."""
        deadline = time.monotonic() + settle_s
        while any(self._live.values()) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        out = sorted(self._finished)
        self._finished = []
        if not any(self._live.values()):  # nothing live: no cut attempt's release is still to come
            self._cut.clear()
        return out

    def migration_counters(self) -> dict[str, int]:
        """Redirected (resumed) requests and the context tokens they re-prefilled, since the balancer started."""
        return {"requests": self.redirected_requests, "context_tokens": self.redirected_context_tokens}

    async def drop_dead_servers(self, timeout_s: float = 5.0) -> list[str]:
        """Remove servers whose actor no longer answers (died or unreachable); return their ids."""

        async def alive(handle) -> bool:
            try:
                await asyncio.wait_for(handle.__ray_ready__.remote(), timeout_s)
                return True
            except (ray.exceptions.RayActorError, asyncio.TimeoutError):
                return False

        ids = list(self._servers)
        states = await asyncio.gather(*[alive(self._servers[s]) for s in ids])
        dead = [s for s, ok in zip(ids, states) if not ok]
        if dead:
            self.remove_servers(dead)
            for s in dead:
                self._live.pop(s, None)
        return dead
