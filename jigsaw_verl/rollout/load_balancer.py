"""``MigratingLoadBalancer``: verl's global load balancer plus what migration needs to know.

Built on ``verl/workers/rollout/router.py`` (``GlobalRequestLoadBalancer``): routing is unchanged (sticky
sessions, least in-flight); removing a server already drops its sticky entries lazily. This subclass records
which servers were taken out of routing for migration, so they can be put back, and reports routing state.
Pass it as ``load_balancer_cls`` to verl's ``LLMServerManager`` / ``get_router_handle``.
"""

from __future__ import annotations

from verl.workers.rollout.router import GlobalRequestLoadBalancer


class MigratingLoadBalancer(GlobalRequestLoadBalancer):
    """verl's load balancer with parking: servers taken out of routing keep their handle for restore."""

    def __init__(self, servers: dict, yaml_config: dict | None = None, **kwargs):
        # verl builds router plugins named in rollout.router_config_path as cls(servers, yaml_config)
        if isinstance(yaml_config, dict):
            kwargs.setdefault("max_cache_size", yaml_config.get("max_cache_size", 10000))
            kwargs.setdefault("full_determinism", bool(yaml_config.get("full_determinism", False)))
        elif yaml_config is not None:
            kwargs["max_cache_size"] = yaml_config
        super().__init__(servers, **kwargs)
        self._parked: dict = {}

    def park_servers(self, server_ids: list[str]) -> dict[str, int]:
        """Stop routing to ``server_ids`` (new requests and resumed ones go elsewhere); returns each one's
        in-flight count at that moment."""
        missing = [s for s in server_ids if s not in self._servers]
        if missing:
            raise KeyError(f"not routable (unknown or already parked): {missing}")
        if len(server_ids) >= len(self._servers):
            raise ValueError("cannot park every server: migrated requests need somewhere to go")
        inflight = {s: self._inflight_requests.get(s, 0) for s in server_ids}
        for s in server_ids:
            self._parked[s] = self._servers[s]
        self.remove_servers(server_ids)
        return inflight

    def unpark_servers(self, server_ids: list[str]) -> None:
        """Put parked servers back into routing."""
        missing = [s for s in server_ids if s not in self._parked]
        if missing:
            raise KeyError(f"not parked: {missing}")
        self.add_servers({s: self._parked.pop(s) for s in server_ids})

    def parked_servers(self) -> list[str]:
        return list(self._parked)

    async def drop_dead_servers(self, timeout_s: float = 5.0) -> list[str]:
        """Remove servers whose actor no longer answers (died or unreachable); return their ids."""
        import asyncio

        import ray

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
        return dead
