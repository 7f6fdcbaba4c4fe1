"""CPU rollout servers for the migration tests, started once per test module and reused, and one rollout over them:
its balancer, its migrating client (recording where each attempt went) and its migrator over verl's replica objects.

The servers are brought back to a clean state at every use the way verl brings its replicas back between steps:
woken, sent the model's weights, resumed. Each rollout counts tokens from the servers' counters at that moment."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from types import SimpleNamespace

from omegaconf import OmegaConf
from replica_attach import attach_replica

from jigsaw_verl.integration.cpu.assets import build_tiny_assets

RESPONSE = 24
PROMPT = 64
LONGEST = 480  # the longest response a test asks for (with max_tokens); the servers' context has room for it


def tokenized_prompts() -> list[list[int]]:
    """The tiny dataset's first 32 prompts, chat-templated and tokenized."""
    import pandas as pd
    from transformers import AutoTokenizer

    assets = build_tiny_assets()
    tok = AutoTokenizer.from_pretrained(assets.model)
    rows = pd.read_parquet(assets.train_file)["prompt"].tolist()[:32]
    return [
        tok(tok.apply_chat_template(list(r), add_generation_prompt=True, tokenize=False), add_special_tokens=False)[
            "input_ids"
        ]
        for r in rows
    ]


def _recording_client_cls():
    from jigsaw_verl.integration.rollout.client import MigratingLLMServerClient

    class RecordingClient(MigratingLLMServerClient):
        """The real migrating client; records which server each attempt of each request id was routed to."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.attempts: list[tuple[str, str]] = []

        async def _acquire_server(self, request_id, **extra):
            server_id, handle = await super()._acquire_server(request_id, **extra)
            self.attempts.append((request_id, server_id))
            return server_id, handle

    return RecordingClient


class ServerPool:
    """CPU rollout servers started once per model folder and handed out, clean, to each rollout of the module.

    A server's default response is ``RESPONSE`` tokens (what verl's agent loop gets, as it sends no ``max_tokens``);
    its context has room for ``LONGEST`` so a test can ask for longer responses with ``max_tokens``."""

    def __init__(self, ray):
        self.ray = ray
        self.started: dict[str, list] = {}
        self.weights: dict[str, object] = {}

    def start(self, model: str, rank: int):
        from jigsaw_verl.integration.cpu.rollout.server import CPURolloutServer

        cfg = SimpleNamespace(max_num_seqs=64, prompt_length=PROMPT, response_length=RESPONSE,
                              max_model_len=PROMPT + LONGEST, seed=0, full_determinism=False)  # fmt: skip
        return (
            self.ray.remote(CPURolloutServer)
            .options(max_concurrency=1000, num_cpus=0)
            .remote(config=cfg, model_config=SimpleNamespace(local_path=model), replica_rank=rank)
        )

    def stop(self) -> None:
        for handles in self.started.values():
            for h in handles:
                self.ray.kill(h)

    def servers(self, model: str, n: int) -> list:
        """``n`` servers of ``model``, awake, holding the model's own weights and accepting requests."""
        from transformers import AutoModelForCausalLM

        have = self.started.setdefault(model, [])
        have += [self.start(model, rank) for rank in range(len(have), n)]
        if model not in self.weights:
            state = AutoModelForCausalLM.from_pretrained(model).state_dict()
            self.weights[model] = self.ray.put({k: v.clone() for k, v in state.items()})
        for h in have[:n]:  # verl's order between steps: wake, load the trainer's weights, take requests again
            self.ray.get(h.wake_up.remote())
            self.ray.get(h.update_weights.remote(self.weights[model]))
            self.ray.get(h.resume_generation.remote())
        return have[:n]


@dataclass
class Rollout:
    """One rollout over pooled servers: its own client and migrator, its own balancer unless :meth:`again` made it;
    token and request counts start at zero. ``servers`` are what the balancer routes to (address -> server actor),
    ``counting`` the CPU servers that generate for them (the same ones unless a double forwards to them)."""

    ray: object
    servers: dict
    counting: dict
    config: object
    lb: object
    client: object
    migrator: object
    tokens_at_start: dict
    requests_at_start: int

    async def tokens(self, names) -> int:
        """Tokens the servers ``names`` generated in this rollout."""
        stats = await asyncio.gather(*[self.counting[s].telemetry.remote() for s in names])
        return sum(t["tokens_generated"] - self.tokens_at_start[s] for s, t in zip(names, stats))

    async def until_tokens(self, names, n: int) -> None:
        """Wait until the servers ``names`` have generated ``n`` tokens between them in this rollout."""
        while await self.tokens(names) < n:
            await asyncio.sleep(0.005)

    def again(self) -> Rollout:
        """A second rollout on the same servers and balancer: a new client and migrator, counts from now."""
        return rollout_over(self.ray, self.servers, self.config, lb=self.lb, replicas=self.migrator.replicas,
                        counting=self.counting)  # fmt: skip

    async def requests(self) -> int:
        """Requests the servers were sent in this rollout (a resumed request counts again)."""
        stats = await asyncio.gather(*[h.telemetry.remote() for h in self.counting.values()])
        return sum(t["requests"] for t in stats) - self.requests_at_start


def rollout_over(ray, servers: dict, config=None, lb=None, replicas=None, counting=None) -> Rollout:
    """A rollout over ``servers`` (address -> CPU server actor, unless ``replicas`` and ``counting`` say otherwise):
    the migrator drives verl's replica objects for them (``CPURolloutReplica`` unless ``replicas`` are given)."""
    from jigsaw_verl.integration.cpu.rollout.replica import CPURolloutReplica
    from jigsaw_verl.integration.rollout.load_balancer import MigratingLoadBalancer
    from jigsaw_verl.integration.rollout.migrator import RolloutMigrator

    counting = counting or servers
    replicas = replicas or {a: attach_replica(CPURolloutReplica, i, h, a) for i, (a, h) in enumerate(servers.items())}
    # every server has loaded its model before any request is sent, as verl's replicas are up before a rollout;
    # otherwise one slow start-up holds the tests' telemetry polls while the other servers finish their work
    stats = ray.get([h.telemetry.remote() for h in counting.values()])
    lb = lb or ray.remote(MigratingLoadBalancer).remote(servers=servers)
    config = config or OmegaConf.create(
        {"actor_rollout_ref": {"rollout": {"name": "cpu", "full_determinism": False, "response_length": RESPONSE}}}
    )
    client = _recording_client_cls()(config=config, load_balancer_handle=lb)
    return Rollout(
        ray=ray, servers=servers, counting=counting, config=config, lb=lb, client=client,
        migrator=RolloutMigrator(lb, replicas),
        tokens_at_start={s: t["tokens_generated"] for s, t in zip(counting, stats)},
        requests_at_start=sum(t["requests"] for t in stats),
    )  # fmt: skip


def named(handles: list) -> dict:
    return {f"r{i}": h for i, h in enumerate(handles)}


GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "logprobs": True, "ignore_eos": True}


async def generate_all(client, prompts, **params):
    return await asyncio.gather(
        *[
            client.generate(f"req-{i}", prompt_ids=p, sampling_params={**GREEDY, **params})
            for i, p in enumerate(prompts)
        ]
    )


def tiny_model() -> str:
    return str(build_tiny_assets().model)
