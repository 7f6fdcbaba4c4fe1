"""Rollout migration on real CPU rollout servers in Ray, through verl's own load balancer and resuming client."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from jigsaw_verl.integration.cpu.assets import build_tiny_assets

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


def _rollout(ray, n_servers: int, model=None, config=None, response_length: int = RESPONSE):
    from jigsaw_verl.integration.cpu.rollout.server import CPURolloutServer
    from jigsaw_verl.integration.rollout.load_balancer import MigratingLoadBalancer
    from jigsaw_verl.integration.rollout.migrator import RolloutMigrator

    model = model or build_tiny_assets().model
    cfg = SimpleNamespace(max_num_seqs=64, prompt_length=64, response_length=response_length, max_model_len=None,
                          seed=0, full_determinism=False)  # fmt: skip
    servers = {
        f"r{i}": ray.remote(CPURolloutServer)
        .options(max_concurrency=1000, num_cpus=0)
        .remote(config=cfg, model_config=SimpleNamespace(local_path=str(model)), replica_rank=i)
        for i in range(n_servers)
    }
    # every server has loaded its model before any request is sent, as verl's replicas are up before a rollout;
    # otherwise one slow start-up holds the tests' telemetry polls while the other servers finish their work
    ray.get([h.telemetry.remote() for h in servers.values()])
    lb = ray.remote(MigratingLoadBalancer).remote(servers=servers)
    config = config or OmegaConf.create(
        {"actor_rollout_ref": {"rollout": {"name": "cpu", "full_determinism": False, "response_length": RESPONSE}}}
    )
    client = _recording_client_cls()(config=config, load_balancer_handle=lb)
    return servers, lb, client, RolloutMigrator(lb, servers)


async def _until_tokens(servers, names, n):
    """Wait until the servers ``names`` have generated ``n`` tokens between them."""
    while sum([(await servers[s].telemetry.remote())["tokens_generated"] for s in names]) < n:
        await asyncio.sleep(0.005)


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


def test_chosen_requests_move_to_chosen_targets(ray_session, prompts):
    """``migrate(sources, targets, requests)``: first half of one replica's live requests move to a chosen
    target while the source keeps the rest and stays routable; then everything on another replica moves to the
    same target. Greedy text is unchanged, request ids are kept, and every resumed attempt went to the target."""

    async def go():
        # responses four times the default: headroom so r1 is still generating after r2's subset migration and
        # the polls that follow it, even on a loaded machine
        servers, _, client, _ = _rollout(ray_session, 3, response_length=4 * RESPONSE)
        plain = await _generate_all(client, prompts)
        servers, lb, client, migrator = _rollout(ray_session, 3, response_length=4 * RESPONSE)
        task = asyncio.create_task(_generate_all(client, prompts))
        await _until_tokens(servers, ["r2"], 2 * 8)
        live = await lb.live_requests.remote()
        chosen = live["r2"][: len(live["r2"]) // 2]
        subset = await migrator.migrate(["r2"], targets=["r0"], requests=chosen)
        routable_after_subset = await lb.get_all_servers.remote()
        await _until_tokens(servers, ["r1"], 6 * 8)
        full = await migrator.migrate(["r1"], targets=["r0"])
        moved = await task
        counters = await lb.migration_counters.remote()
        return plain, moved, chosen, subset, routable_after_subset, full, client.attempts, counters

    plain, moved, chosen, subset, routable_after_subset, full, attempts, counters = asyncio.run(go())
    assert len(chosen) >= 2 and subset.migrated_requests == len(chosen) and not subset.freed
    assert sorted(routable_after_subset) == ["r0", "r1", "r2"]  # the source keeps its other requests
    assert full.freed and full.targets == ("r0",) and full.migrated_requests > 0
    for a, b in zip(plain, moved):
        assert a.token_ids == b.token_ids and b.log_probs == pytest.approx(a.log_probs, abs=1e-4)
    by_request: dict[str, list[str]] = {}
    for rid, server in attempts:
        by_request.setdefault(rid, []).append(server)
    assert sorted(by_request) == sorted(f"req-{i}" for i in range(len(prompts)))  # ids kept, none invented
    for rid in chosen:
        assert by_request[rid][:2] == ["r2", "r0"]  # moved off r2, resumed on the chosen target
    resumed = [servers[1:] for servers in by_request.values()]
    assert all(s == "r0" for servers in resumed for s in servers)  # every resumed attempt went to the target
    assert sum(len(s) for s in resumed) == subset.migrated_requests + full.migrated_requests
    assert counters["requests"] == subset.migrated_requests + full.migrated_requests
    assert counters["context_tokens"] > counters["requests"] * min(len(p) for p in prompts)


def _agent_loop_config(model_dir: str):
    from hydra import compose, initialize_config_dir

    from jigsaw_verl.integration.settings import CONFIG_FILE

    config_dir = str(CONFIG_FILE.parent)
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(
            config_name="jigsaw_ppo_trainer",
            overrides=[
                f"actor_rollout_ref.model.path={model_dir}",
                "actor_rollout_ref.rollout.name=cpu",
                "actor_rollout_ref.rollout.temperature=0",
                "actor_rollout_ref.rollout.calculate_log_probs=True",
                "actor_rollout_ref.rollout.prompt_length=64",
                f"actor_rollout_ref.rollout.response_length={RESPONSE}",
                "data.max_prompt_length=64",
                f"data.max_response_length={RESPONSE}",
            ],
        )


def test_agent_loop_batch_unchanged_by_a_migration(ray_session, prompts, tmp_path):
    """verl's own agent loop (``AgentLoopWorker`` + single-turn loop) over the migrating client: the output
    batch has the same fields, shapes and values (greedy) with a 2 -> 1 migration midway as without, uids and
    indices in order. The model is an untrained copy of the tiny one, so responses run long enough to migrate."""
    import numpy as np
    import pandas as pd
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from verl.experimental.agent_loop.agent_loop import AgentLoopWorker
    from verl.protocol import DataProto

    assets = build_tiny_assets()
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(assets.model)).save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(assets.model).save_pretrained(tmp_path)
    config = _agent_loop_config(str(tmp_path))
    rows = pd.read_parquet(assets.train_file).head(32)

    def batch() -> DataProto:
        return DataProto.from_dict(
            non_tensors={
                "raw_prompt": np.array([list(r) for r in rows["prompt"]], dtype=object),
                "uid": np.array([f"uid-{i}" for i in range(len(rows))], dtype=object),
                "index": np.arange(len(rows)),
            },
            meta_info={"global_steps": 1},
        )

    async def go():
        servers, _, client, _ = _rollout(ray_session, 2, model=tmp_path, config=config)
        plain = await AgentLoopWorker(config, llm_client=client).generate_sequences(batch())
        servers, _, client, migrator = _rollout(ray_session, 2, model=tmp_path, config=config)
        task = asyncio.create_task(AgentLoopWorker(config, llm_client=client).generate_sequences(batch()))
        await _until_tokens(servers, ["r1"], 2 * 16)
        report = await migrator.migrate(["r1"])
        return plain, await task, report, client.attempts

    plain, moved, report, attempts = asyncio.run(go())
    assert report.migrated_requests > 0
    resumed = {rid for rid, server in attempts if server == "r0"} & {rid for rid, server in attempts if server == "r1"}
    assert len(resumed) == report.migrated_requests  # those requests really continued on r0 under their own id
    assert sorted(moved.batch.keys()) == sorted(plain.batch.keys())
    assert "rollout_log_probs" in plain.batch.keys()
    for key in plain.batch.keys():
        assert moved.batch[key].shape == plain.batch[key].shape, key
        if key == "rollout_log_probs":
            torch.testing.assert_close(moved.batch[key], plain.batch[key], atol=1e-4, rtol=0)
        else:
            assert torch.equal(moved.batch[key], plain.batch[key]), key
    assert plain.batch["response_mask"].sum(-1).float().mean() > RESPONSE / 2  # responses long enough to migrate
    assert sorted(moved.non_tensor_batch) == sorted(plain.non_tensor_batch)
    assert list(moved.non_tensor_batch["uid"]) == [f"uid-{i}" for i in range(32)]
    assert list(moved.non_tensor_batch["index"]) == list(range(32))


def test_the_groups_migration_order_runs_through_the_tail_monitor(ray_session, prompts):
    """The live scheduler's side of a migration, on real servers: pipeline ``a`` rolls out on two replicas (slots 0
    and 1 of a 2-slot pool) while ``b``, whose home is slot 0, waits. The tail monitor reports a's replicas to the
    group each poll; once both are down to one long request, the group's policy orders replica 0's requests onto
    replica 1; the monitor runs it through the migrator and confirms it, and the executor grants b's stage on the
    freed slot while a's rollout is still running. (The group here is the executor in-process, behind the two calls
    the scheduler actor answers; its policy is a test policy that always migrates for a waiting pipeline: what is
    tested is the path of the order, not a policy's judgement.)"""
    from dataclasses import asdict

    from test_live_executor_on_cpu import _MigrateForTheWaiting, _spec

    from jigsaw_verl.integration.rollout.tail_monitor import TailMonitor
    from jigsaw_verl.model.slots import CPU_SLOT
    from jigsaw_verl.runtime.executor import LiveExecutor, ReplicaReport

    LONG = 480
    homes = {"a": (0, 1), "b": (0,)}
    ex = LiveExecutor(2, CPU_SLOT, lambda workload: _MigrateForTheWaiting(homes), policy_name="test")
    ex.join(_spec("a"), 2, 0.0)
    ex.join(_spec("b"), 1, 0.0)
    ex.request("a", 0, "rollout", 0.0)
    assert ex.request("b", 0, "rollout", 0.0) == []
    granted, seen_context = [], []

    class Group:
        """The scheduler actor's ``report_replicas`` / ``migrated``, in-process."""

        async def report_replicas(self, replicas):
            seen_context.extend(r["context_tokens"] for r in replicas if r["live"])
            grants, orders = ex.report_replicas("a", 0, [ReplicaReport(**r) for r in replicas], 1.0)
            granted.extend(grants)
            return [asdict(o) for o in orders]

        async def migrated(self, sources):
            granted.extend(ex.migrated("a", 0, tuple(sources), 2.0))

    async def go():
        servers, lb, client, migrator = _rollout(ray_session, 2, response_length=LONG)
        # two long requests, one on each replica (the second sent once the first is live: least in-flight routing
        # sends it to the other), then fourteen short ones: a tail of one request per replica, long enough for the
        # monitor's polls to see it
        lengths = [LONG if i < 2 else 2 for i in range(16)]
        jobs = []
        for i, (p, n) in enumerate(zip(prompts, lengths)):
            params = {**GREEDY, "max_tokens": n}
            jobs.append(asyncio.create_task(client.generate(f"req-{i}", prompt_ids=p, sampling_params=params)))
            while i < 2 and sum(map(len, (await lb.live_requests.remote()).values())) <= i:
                await asyncio.sleep(0.005)
        monitor = TailMonitor(migrator, None, group=Group(), addresses=["r0", "r1"], poll_s=0.02)
        monitor.start()
        outputs = await asyncio.gather(*jobs)
        monitor.stop()
        finishes = await lb.take_finish_times.remote()
        return outputs, migrator.reports, await lb.get_all_servers.remote(), finishes

    outputs, reports, routable, finishes = asyncio.run(go())
    assert [len(o.token_ids) for o in outputs] == [LONG, LONG] + [2] * 14  # every request whole
    assert [(r.sources, r.targets) for r in reports] == [(("r0",), ("r1",))]
    assert reports[0].migrated_requests == 1 and routable == ["r1"]
    # the balancer saw 16 requests finish: the migrated one once, its aborted attempt not at all
    assert len(finishes) == 16 and finishes == sorted(finishes)
    assert seen_context and all(c > 0 for c in seen_context)  # the live context each replica held, reported
    assert [(g.pipeline, g.stage, g.gpus) for g in granted] == [("b", "rollout", (0,))]
    assert ex.pipes["a"].running[(0, "rollout")].gpus == (1,)
