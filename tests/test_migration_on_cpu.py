"""Rollout migration on real CPU rollout servers in Ray, through verl's own load balancer, resuming client and replica
objects (``CPURolloutReplica``, with vLLM's replica surface, and a double of verl's SGLang replica and server).

The servers are started once for the whole module (``rollout_pool``: a start loads torch, transformers and the model,
about ten CPU-seconds each) and brought back to a clean state at every use; each use gets its own load balancer,
client and migrator."""

from __future__ import annotations

import asyncio

import pytest
from omegaconf import OmegaConf
from rollout_pool import (
    GREEDY,
    LONGEST,
    RESPONSE,
    ServerPool,
    generate_all,
    named,
    rollout_over,
    tiny_model,
    tokenized_prompts,
)

from jigsaw_verl.integration.cpu.assets import build_tiny_assets


@pytest.fixture(scope="module")
def prompts():
    return tokenized_prompts()


@pytest.fixture(scope="module")
def pool(ray_session):
    servers = ServerPool(ray_session)
    yield servers
    servers.stop()


@pytest.mark.parametrize("sampling", [{}, {"temperature": 1.0, "seed": 11}], ids=["greedy", "seeded-sample"])
def test_tokens_identical_with_a_migration_midway(ray_session, pool, prompts, sampling):
    """A migrated request is one continuous response, token for token: greedy, and sampled with a seed (the CPU
    server's draws are counter-based, so the resume continues the stream; vLLM would restart it)."""

    async def go():
        first = rollout_over(ray_session, named(pool.servers(tiny_model(), 2)))
        plain = await generate_all(first.client, prompts, **sampling)
        ro = first.again()
        task = asyncio.create_task(generate_all(ro.client, prompts, **sampling))
        await ro.until_tokens(["r1"], 2 * 16)
        report = await ro.migrator.migrate(["r1"])
        moved = await task
        after = await ro.migrator.telemetry()
        await ro.migrator.restore(["r1"])
        restored = await ro.lb.get_all_servers.remote()
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


def test_the_trainer_returns_a_migrated_from_replica_to_routing_still_asleep(ray_session, pool, prompts):
    """At the end of a rollout verl sleeps its hybrid replicas and its next weight sync wakes them: trainer mode
    ``jigsaw`` puts a replica its migration freed back into routing asleep, holding no device memory on a slot that
    may be another pipeline's by then (the server's resident parts are what it charges a slot's ledger). With
    ``free_cache_engine=false`` verl never sleeps or wakes its replicas, so that one is woken."""
    from jigsaw_verl.integration.trainer.v1_jigsaw import JigsawPPOTrainerV1

    async def migrate_one():
        ro = rollout_over(ray_session, named(pool.servers(tiny_model(), 2)))
        task = asyncio.create_task(generate_all(ro.client, prompts))
        await ro.until_tokens(["r1"], 16)
        report = await ro.migrator.migrate(["r1"])
        await task
        return ro, report

    for free_cache_engine, awake in ((True, False), (False, True)):
        ro, report = asyncio.run(migrate_one())
        assert report.freed and report.sources == ("r1",)
        trainer = object.__new__(JigsawPPOTrainerV1)  # the trainer's own method, on this rollout's migrator
        trainer.config = OmegaConf.create({"actor_rollout_ref": {"rollout": {"free_cache_engine": free_cache_engine}}})
        trainer._jigsaw_migrator = ro.migrator
        trainer._return_migrated_replicas([report])
        resident = ray_session.get(ro.servers["r1"].__ray_call__.remote(lambda server: dict(server._resident)))
        assert resident == {"weights": awake, "kv_cache": awake}, (free_cache_engine, resident)
        assert sorted(ray_session.get(ro.lb.get_all_servers.remote())) == ["r0", "r1"]


def _signatures(path, class_name: str) -> dict[str, str]:
    """Each method of class ``class_name`` in the Python file ``path``: ``async``-ness, decorators, parameter names,
    kinds and defaults (annotations aside, as the doubles do not import SGLang's types)."""
    import ast

    tree = ast.parse(path.read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name]
    out = {}
    for fn in cls.body:
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            args = fn.args
            for a in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg):
                if a is not None:
                    a.annotation = None
            fn.returns = None
            decorators = [ast.unparse(d) for d in fn.decorator_list]
            out[fn.name] = f"{type(fn).__name__} {decorators} ({ast.unparse(args)})"
    return out


def test_the_sglang_doubles_have_verls_signatures():
    """``SGLangHttpServerDouble`` has exactly the public methods of the installed verl's ``SGLangHttpServer`` (its
    constructor aside: it takes the CPU server it forwards to), ``SGLangReplicaDouble`` exactly what verl's
    ``SGLangReplica`` defines over ``RolloutReplica``, each with the same parameters and defaults."""
    from pathlib import Path

    import sglang_double
    import verl.workers.rollout as rollout

    verl_file = Path(rollout.__file__).parent / "sglang_rollout" / "async_sglang_server.py"
    double_file = Path(sglang_double.__file__)
    verl_server = {k: v for k, v in _signatures(verl_file, "SGLangHttpServer").items() if not k.startswith("_")}
    double_server = {k: v for k, v in _signatures(double_file, "SGLangHttpServerDouble").items() if k != "__init__"}
    assert double_server == verl_server
    assert "abort_request" not in verl_server and "abort_all_requests" in verl_server  # what the migrator meets
    assert _signatures(double_file, "SGLangReplicaDouble") == _signatures(verl_file, "SGLangReplica")


def test_sglang_replicas_migrate_everything_through_verls_replica_objects(ray_session, pool, prompts):
    """Against doubles of verl's SGLang server and replica (``sglang_double``; the tokens come from real CPU
    servers behind them): a full migration goes through the replica objects (``abort_all_requests`` with
    ``reject_request``, which SGLang's replica accepts and its server would not), the moved requests resume on the
    other replica with the same greedy text, and the source sleeps; moving some of a replica's requests is refused
    before anything moves (SGLang has no per-request abort); restoring does not raise though SGLang's hybrid server
    refuses ``wake_up``: the replica routes again and wakes at its next weight sync."""
    import sglang_double
    from replica_attach import attach_replica
    from sglang_double import SGLangHttpServerDouble, SGLangReplicaDouble

    from jigsaw_verl.integration.rollout.migrator import PartialMigrationUnsupported

    ray = ray_session
    ray.cloudpickle.register_pickle_by_value(sglang_double)  # Ray's workers cannot import the tests' modules
    counting = named(pool.servers(tiny_model(), 2))
    doubles = {
        a: ray.remote(SGLangHttpServerDouble).options(max_concurrency=1000, num_cpus=0).remote(h)
        for a, h in counting.items()
    }
    replicas = {a: attach_replica(SGLangReplicaDouble, i, d, a, "sglang") for i, (a, d) in enumerate(doubles.items())}
    config = OmegaConf.create(
        {"actor_rollout_ref": {"rollout": {"name": "sglang", "full_determinism": False, "response_length": RESPONSE}}}
    )

    def resident(address: str) -> dict:
        return ray.get(counting[address].__ray_call__.remote(lambda server: dict(server._resident)))

    async def go():
        first = rollout_over(ray, doubles, config, replicas=replicas, counting=counting)
        plain = await generate_all(first.client, prompts)
        ro = first.again()
        task = asyncio.create_task(generate_all(ro.client, prompts))
        await ro.until_tokens(["r1"], 2 * 16)
        some = (await ro.lb.live_requests.remote())["r1"][:1]
        assert some, "r1 holds live requests"
        with pytest.raises(PartialMigrationUnsupported, match="SGLangReplicaDouble has no abort_request"):
            await ro.migrator.migrate(["r1"], requests=some)
        routable_after_refusal = await ro.lb.get_all_servers.remote()
        report = await ro.migrator.migrate(["r1"])
        moved = await task
        asleep = resident("r1")
        await ro.migrator.restore(["r1"])
        return plain, moved, report, routable_after_refusal, asleep, ro

    plain, moved, report, routable_after_refusal, asleep, ro = asyncio.run(go())
    try:
        assert sorted(routable_after_refusal) == ["r0", "r1"]  # the refusal changed no routing
        assert report.freed and report.sources == ("r1",) and report.targets == ("r0",)
        resumed = {r for r, s in ro.client.attempts if s == "r0"} & {r for r, s in ro.client.attempts if s == "r1"}
        # SGLang's abort answers no count: the migrator counts what the balancer moved, and each of those resumed
        assert report.migrated_requests == len(resumed) > 0
        assert ray.get(ro.lb.migration_counters.remote())["requests"] == report.migrated_requests
        for a, b in zip(plain, moved, strict=True):
            assert len(b.token_ids) == RESPONSE and b.stop_reason == "length"
            assert a.token_ids == b.token_ids and b.log_probs == pytest.approx(a.log_probs, abs=1e-4)
        assert asleep == {"weights": False, "kv_cache": False}  # the source slept once drained
        assert resident("r1") == asleep  # restore did not wake it (SGLang's hybrid server wakes in update_weights)
        assert sorted(ray.get(ro.lb.get_all_servers.remote())) == ["r0", "r1"]
    finally:
        for d in doubles.values():
            ray.kill(d)


def test_migrating_everything_is_refused(ray_session, pool):
    async def go():
        migrator = rollout_over(ray_session, named(pool.servers(tiny_model(), 2))).migrator
        with pytest.raises(Exception, match="cannot park every server"):
            await migrator.migrate(["r0", "r1"])
        with pytest.raises(KeyError, match="unknown replicas"):
            await migrator.migrate(["r9"])

    asyncio.run(go())


SAMPLE = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}


def test_many_requests_migrate_none_lost_none_run_twice(ray_session, pool, prompts):
    """Sampling, half the requests stopping early at their end token: every request returns once, whole, and no
    finished request is run again: the servers saw exactly one call per request plus one per migrated request."""

    async def go():
        ro = rollout_over(ray_session, named(pool.servers(tiny_model(), 3)))
        many = prompts * 2
        # half stop at their end token (some during the migration), half run to the full length (in flight)
        params = [dict(SAMPLE, ignore_eos=i % 2 == 0) for i in range(len(many))]
        task = asyncio.gather(
            *[ro.client.generate(f"m-{i}", prompt_ids=p, sampling_params=params[i]) for i, p in enumerate(many)]
        )
        await ro.until_tokens(list(ro.servers), 120)
        report = await ro.migrator.migrate(["r1", "r2"])
        outs = await task
        return many, outs, report, await ro.requests()

    many, outs, report, calls = asyncio.run(go())
    assert len(outs) == len(many)
    for i, o in enumerate(outs):
        assert o.stop_reason in ("completed", "length") and 1 <= len(o.token_ids) <= RESPONSE
        assert len(o.log_probs) == len(o.token_ids)
        if i % 2 == 0:
            assert len(o.token_ids) == RESPONSE
    assert report.migrated_requests > 0
    assert calls == len(many) + report.migrated_requests


def test_killed_replica_requests_resume_elsewhere(ray_session, pool, prompts):
    """The fault path is the migration path: kill a replica's actor mid-generation; its requests resume on
    the other replica and finish with the same greedy text. (The killed replica is a server of its own, not the
    pool's.)"""

    async def go():
        r0, r1 = pool.servers(tiny_model(), 2)
        plain = await generate_all(rollout_over(ray_session, {"r0": r0, "r1": r1}).client, prompts[:12])
        victim = pool.start(tiny_model(), rank=1)
        ro = rollout_over(ray_session, {"r0": r0, "r1": victim})
        task = asyncio.create_task(generate_all(ro.client, prompts[:12]))
        await ro.until_tokens(["r1"], 6)
        ray_session.kill(victim)
        outs = await task
        return plain, outs, await ro.lb.get_all_servers.remote()

    plain, outs, routable = asyncio.run(go())
    assert routable == ["r0"]
    for a, b in zip(plain, outs):
        assert a.token_ids == b.token_ids and len(b.token_ids) == RESPONSE


def test_chosen_requests_move_to_chosen_targets(ray_session, pool, prompts):
    """``migrate(sources, targets, requests)``: first half of one replica's live requests move to a chosen
    target while the source keeps the rest and stays routable; then everything on another replica moves to the
    same target. Greedy text is unchanged, request ids are kept, and every resumed attempt went to the target."""

    # responses four times the default: headroom so r1 is still generating after r2's subset migration and
    # the polls that follow it, even on a loaded machine
    length = {"max_tokens": 4 * RESPONSE}

    async def go():
        first = rollout_over(ray_session, named(pool.servers(tiny_model(), 3)))
        plain = await generate_all(first.client, prompts, **length)
        ro = first.again()
        lb, migrator = ro.lb, ro.migrator
        task = asyncio.create_task(generate_all(ro.client, prompts, **length))
        await ro.until_tokens(["r2"], 2 * 8)
        live = await lb.live_requests.remote()
        chosen = live["r2"][: len(live["r2"]) // 2]
        subset = await migrator.migrate(["r2"], targets=["r0"], requests=chosen)
        routable_after_subset = await lb.get_all_servers.remote()
        await ro.until_tokens(["r1"], 6 * 8)
        full = await migrator.migrate(["r1"], targets=["r0"])
        moved = await task
        counters = await lb.migration_counters.remote()
        return plain, moved, chosen, subset, routable_after_subset, full, ro.client.attempts, counters

    plain, moved, chosen, subset, routable_after_subset, full, attempts, counters = asyncio.run(go())
    assert all(len(b.token_ids) == 4 * RESPONSE for b in moved)

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


def test_agent_loop_batch_unchanged_by_a_migration(ray_session, pool, prompts, tmp_path):
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
        first = rollout_over(ray_session, named(pool.servers(str(tmp_path), 2)), config=config)
        plain = await AgentLoopWorker(config, llm_client=first.client).generate_sequences(batch())
        ro = first.again()
        task = asyncio.create_task(AgentLoopWorker(config, llm_client=ro.client).generate_sequences(batch()))
        await ro.until_tokens(["r1"], 2 * 16)
        report = await ro.migrator.migrate(["r1"])
        return plain, await task, report, ro.client.attempts

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


def test_the_groups_migration_order_runs_through_the_tail_monitor(ray_session, pool, prompts):
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

    LONG = LONGEST
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
        ro = rollout_over(ray_session, named(pool.servers(tiny_model(), 2)))
        lb, client, migrator = ro.lb, ro.client, ro.migrator
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


def test_a_cut_attempts_release_after_its_resumed_acquire_does_not_count_as_a_finish():
    """verl's client sends a release without waiting for it, and the balancer (an async Ray actor) may run the
    resumed attempt's acquire first: the cut attempt is known by the server it was moved off, so it never counts
    as a finish, in either order; a request sharing its id on another server still does (once seen as 33
    finishes for 32 responses in a loaded mux run). Real balancer class, called in process, in both orders."""
    from jigsaw_verl.integration.rollout.load_balancer import MigratingLoadBalancer

    counts = {}
    for resumed_first in (False, True):
        lb = MigratingLoadBalancer({"r0": "handle-0", "r1": "handle-1"})
        for rid, server in (("p", "r0"), ("p", "r1")):  # two samples of one prompt (one id), one per server
            lb._request_id_to_server[rid] = server
            assert lb.acquire_server(rid, server_request_id=rid, context_tokens=8)[0] == server
        lb._request_id_to_server.pop("p")
        assert lb.plan_migration(["r0"], ["r1"], requests=["p"])["moved"] == [["r0", "p", "p"]]
        if resumed_first:
            assert lb.acquire_server("p", server_request_id="p", context_tokens=9)[0] == "r1"
            lb.release_server("r0", request_id="p")
        else:
            lb.release_server("r0", request_id="p")
            assert lb.acquire_server("p", server_request_id="p", context_tokens=9)[0] == "r1"
        lb.release_server("r1", request_id="p")  # the sample that never moved
        lb.release_server("r1", request_id="p")  # the resumed attempt
        counts[resumed_first] = len(asyncio.run(lb.take_finish_times(settle_s=0.0)))
    assert counts == {False: 2, True: 2}
