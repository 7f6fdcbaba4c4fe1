"""Rollout migration on real CPU rollout servers in Ray, through verl's own load balancer and resuming client."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from jigsaw_verl.cpu.assets import build_tiny_assets

RESPONSE = 24


@pytest.fixture(scope="module")
def prompts():
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


def _rollout(ray, n_servers: int):
    from jigsaw_verl.cpu.rollout.server import CPURolloutServer
    from jigsaw_verl.rollout.client import MigratingLLMServerClient
    from jigsaw_verl.rollout.load_balancer import MigratingLoadBalancer
    from jigsaw_verl.rollout.migrator import RolloutMigrator

    assets = build_tiny_assets()
    cfg = SimpleNamespace(max_num_seqs=64, prompt_length=64, response_length=RESPONSE, max_model_len=None, seed=0,
                          full_determinism=False)  # fmt: skip
    servers = {
        f"r{i}": ray.remote(CPURolloutServer)
        .options(max_concurrency=1000, num_cpus=0)
        .remote(config=cfg, model_config=SimpleNamespace(local_path=str(assets.model)), replica_rank=i)
        for i in range(n_servers)
    }
    lb = ray.remote(MigratingLoadBalancer).remote(servers=servers)
    config = OmegaConf.create(
        {"actor_rollout_ref": {"rollout": {"name": "cpu", "full_determinism": False, "response_length": RESPONSE}}}
    )
    client = MigratingLLMServerClient(config=config, load_balancer_handle=lb)
    return servers, lb, client, RolloutMigrator(lb, servers)


GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "logprobs": True, "ignore_eos": True}


async def _generate_all(client, prompts):
    return await asyncio.gather(
        *[client.generate(f"req-{i}", prompt_ids=p, sampling_params=dict(GREEDY)) for i, p in enumerate(prompts)]
    )


def test_greedy_tokens_identical_with_a_migration_midway(ray_session, prompts):
    async def go():
        servers, _, client, _ = _rollout(ray_session, 2)
        plain = await _generate_all(client, prompts)
        servers, lb, client, migrator = _rollout(ray_session, 2)
        task = asyncio.create_task(_generate_all(client, prompts))
        while (await servers["r1"].telemetry.remote())["tokens_generated"] < 2 * 16:
            await asyncio.sleep(0.005)
        report = await migrator.migrate(["r1"])
        moved = await task
        after = await migrator.telemetry()
        await migrator.restore(["r1"])
        restored = await lb.get_all_servers.remote()
        return plain, moved, report, after, restored

    plain, moved, report, after, restored = asyncio.run(go())
    assert report.sources == ("r1",) and report.targets == ("r0",)
    assert report.migrated_requests > 0  # requests really were in flight on the source
    assert len(moved) == len(plain) == 32
    for a, b in zip(plain, moved):
        assert len(b.token_ids) == RESPONSE and b.stop_reason == "length"
        assert a.token_ids == b.token_ids  # one continuous response, token for token
        assert b.log_probs == pytest.approx(a.log_probs, abs=1e-4)
    assert not after["r1"]["routable"] and after["r1"]["live_requests"] == 0
    assert sorted(restored) == ["r0", "r1"]


def test_migrating_everything_is_refused(ray_session):
    async def go():
        _, _, _, migrator = _rollout(ray_session, 2)
        with pytest.raises(Exception, match="cannot park every server"):
            await migrator.migrate(["r0", "r1"])
        with pytest.raises(KeyError, match="unknown replicas"):
            await migrator.migrate(["r9"])

    asyncio.run(go())


SAMPLE = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}


def test_many_requests_migrate_none_lost_none_run_twice(ray_session, prompts):
    """Sampling, half the requests stopping early at their end token: every request returns once, whole, and no
    finished request is run again: the servers saw exactly one call per request plus one per migrated request."""

    async def go():
        servers, _, client, migrator = _rollout(ray_session, 3)
        many = prompts * 2
        # half stop at their end token (some during the migration), half run to the full length (in flight)
        params = [dict(SAMPLE, ignore_eos=i % 2 == 0) for i in range(len(many))]
        task = asyncio.gather(
            *[client.generate(f"m-{i}", prompt_ids=p, sampling_params=params[i]) for i, p in enumerate(many)]
        )
        while (
            sum(t["tokens_generated"] for t in await asyncio.gather(*[h.telemetry.remote() for h in servers.values()]))
            < 120
        ):
            await asyncio.sleep(0.005)
        report = await migrator.migrate(["r1", "r2"])
        outs = await task
        calls = sum(t["requests"] for t in await asyncio.gather(*[h.telemetry.remote() for h in servers.values()]))
        return many, outs, report, calls

    many, outs, report, calls = asyncio.run(go())
    assert len(outs) == len(many)
    for i, o in enumerate(outs):
        assert o.stop_reason in ("completed", "length") and 1 <= len(o.token_ids) <= RESPONSE
        assert len(o.log_probs) == len(o.token_ids)
        if i % 2 == 0:
            assert len(o.token_ids) == RESPONSE
    assert report.migrated_requests > 0
    assert calls == len(many) + report.migrated_requests


def test_killed_replica_requests_resume_elsewhere(ray_session, prompts):
    """The fault path is the migration path: kill a replica's actor mid-generation; its requests resume on
    the other replica and finish with the same greedy text."""

    async def go():
        servers, _, client, _ = _rollout(ray_session, 2)
        plain = await _generate_all(client, prompts[:12])
        servers, lb, client, _ = _rollout(ray_session, 2)
        task = asyncio.create_task(_generate_all(client, prompts[:12]))
        while (await servers["r1"].telemetry.remote())["tokens_generated"] < 6:
            await asyncio.sleep(0.005)
        ray_session.kill(servers["r1"])
        outs = await task
        return plain, outs, await lb.get_all_servers.remote()

    plain, outs, routable = asyncio.run(go())
    assert routable == ["r0"]
    for a, b in zip(plain, outs):
        assert a.token_ids == b.token_ids and len(b.token_ids) == RESPONSE
