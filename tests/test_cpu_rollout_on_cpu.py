"""The CPU rollout server (no Ray here: its methods are plain coroutines): generation, continuous batching,
abort/resume, sleep/wake and weight updates, on the real tiny model."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
import torch

from jigsaw_verl.integration.cpu.assets import build_tiny_assets
from jigsaw_verl.integration.cpu.rollout.server import CPURolloutServer, state_checksum


@pytest.fixture(scope="module")
def assets():
    return build_tiny_assets()


def _server(assets, **over) -> CPURolloutServer:
    cfg = dict(max_num_seqs=64, prompt_length=64, response_length=16, max_model_len=None, seed=3,
               full_determinism=True)  # fmt: skip
    cfg.update(over)
    return CPURolloutServer(SimpleNamespace(**cfg), SimpleNamespace(local_path=str(assets.model)), replica_rank=0)


@pytest.fixture(scope="module")
def prompts(assets):
    """Chat prompts of the tiny dataset, tokenized as verl's agent loop does."""
    import pandas as pd
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(assets.model)
    rows = pd.read_parquet(assets.train_file)["prompt"].tolist()
    texts = [tok.apply_chat_template(list(r), add_generation_prompt=True, tokenize=False) for r in rows[:16]]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


async def _until(predicate, seconds: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not predicate():
        assert loop.time() < deadline, "timed out waiting"
        await asyncio.sleep(0.001)


GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "logprobs": True}
SAMPLE = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}


def test_generate_returns_tokens_logprobs_and_stop_reason(assets, prompts):
    async def go():
        s = _server(assets)
        outs = await asyncio.gather(*[s.generate(p, dict(SAMPLE), f"r{i}") for i, p in enumerate(prompts[:12])])
        return s, outs

    s, outs = asyncio.run(go())
    for o in outs:
        assert o.stop_reason == "completed"
        assert 1 <= len(o.token_ids) <= 16 and len(o.log_probs) == len(o.token_ids)
        assert all(lp <= 0 for lp in o.log_probs)
    assert s.stats_requests == 12


def test_greedy_is_batch_invariant(assets, prompts):
    """A request gives the same tokens alone and in a batch of others (continuous batching changes nothing)."""

    async def go():
        s = _server(assets)
        alone = [await s.generate(p, dict(GREEDY), f"a{i}") for i, p in enumerate(prompts)]
        together = await asyncio.gather(*[s.generate(p, dict(GREEDY), f"b{i}") for i, p in enumerate(prompts)])
        return alone, together

    alone, together = asyncio.run(go())
    for a, b in zip(alone, together):
        assert a.token_ids == b.token_ids
        assert a.log_probs == pytest.approx(b.log_probs, abs=1e-4)


def test_requests_join_a_running_batch(assets, prompts):
    async def go():
        s = _server(assets, response_length=32)
        long = {**SAMPLE, "max_tokens": 30, "ignore_eos": True}
        first = asyncio.create_task(s.generate(prompts[0], long, "long"))
        await _until(lambda: s.stats_tokens >= 3)
        second = await s.generate(prompts[1], {**SAMPLE, "max_tokens": 2, "ignore_eos": True}, "short")
        done_when_short_finished = first.done()
        return second, await first, done_when_short_finished

    second, first, first_done = asyncio.run(go())
    assert len(second.token_ids) == 2 and second.stop_reason == "completed"
    assert len(first.token_ids) == 30 and not first_done  # the short one joined and left a running batch


def test_abort_returns_tokens_so_far_then_resume(assets, prompts):
    async def go():
        s = _server(assets, response_length=40)
        params = {**SAMPLE, "max_tokens": 40, "ignore_eos": True}
        tasks = [asyncio.create_task(s.generate(prompts[i], dict(params), f"x{i}")) for i in range(4)]
        await _until(lambda: s.stats_tokens >= 8)
        res = await s.abort_all_requests()
        outs = await asyncio.gather(*tasks)
        parked = asyncio.create_task(s.generate(prompts[5], {**GREEDY, "max_tokens": 3}, "late"))
        await asyncio.sleep(0.05)
        assert not parked.done()  # waits for resume_generation
        await s.resume_generation()
        late = await parked
        rejected_server = _server(assets)
        await rejected_server.abort_all_requests(reject_request=True)
        rejected = await rejected_server.generate(prompts[6], dict(GREEDY), "rej")
        return res, outs, late, rejected

    res, outs, late, rejected = asyncio.run(go())
    assert res["aborted_count"] == 4 and len(res["request_ids"]) == 4 and all(o.stop_reason == "aborted" for o in outs)
    assert all(0 < len(o.token_ids) < 40 and len(o.log_probs) == len(o.token_ids) for o in outs)
    assert late.stop_reason == "completed"
    assert rejected.stop_reason == "aborted" and rejected.token_ids == []


def test_sleep_releases_weights_and_update_restores_them(assets, prompts):
    async def go():
        s = _server(assets)
        before = await s.weights_checksum()
        state = {n: p.detach().clone() for n, p in s.model.named_parameters()}
        await s.sleep()
        released = sum(p.numel() for p in s.model.parameters())
        with pytest.raises(RuntimeError, match="asleep"):
            await s.generate(prompts[0], dict(GREEDY), "z")
        await s.wake_up(tags=["weights"])
        zeros = await s.weights_checksum()
        await s.update_weights(state, global_steps=4)
        after = await s.weights_checksum()
        bad = {"model.embed_tokens.weight": state["model.embed_tokens.weight"]}
        with pytest.raises(ValueError, match="missing"):
            await s.update_weights(bad)
        return before, released, zeros, after, s.global_steps, state

    before, released, zeros, after, steps, state = asyncio.run(go())
    assert released == 0
    assert zeros != before and after == before == state_checksum(state)
    assert steps == 4


def test_seeded_sampling_is_reproducible_and_differs_within_a_group(assets, prompts):
    params = {**SAMPLE, "max_tokens": 8, "ignore_eos": True}

    async def go():
        s = _server(assets)
        outs = await asyncio.gather(*[s.generate(prompts[2], dict(params), "det-0") for _ in range(4)])
        t = _server(assets)
        again = await asyncio.gather(*[t.generate(prompts[2], dict(params), "det-0") for _ in range(4)])
        return outs, again

    outs, again = asyncio.run(go())
    assert sorted(o.token_ids for o in outs) == sorted(o.token_ids for o in again)
    assert len({tuple(o.token_ids) for o in outs}) > 1


def test_text_only(assets, prompts):
    s = _server(assets)
    with pytest.raises(ValueError, match="text only"):
        asyncio.run(s.generate(prompts[0], dict(GREEDY), "img", image_data=[torch.zeros(1)]))


def test_a_sampled_request_resumed_with_its_seed_continues_the_same_stream(assets, prompts):
    """Draws are counter-based (seed, context position): a request cut after 5 tokens and resumed elsewhere as
    prompt + those tokens with the same seed samples the tokens it would have sampled uncut."""
    from jigsaw_verl.integration.cpu.rollout.engine import CPUGenerationEngine, Sequence

    engine = CPUGenerationEngine(_server(assets).model, eos_token_ids=set())

    def sample(prompt: list[int], n: int, seed: int) -> list[int]:
        seq = Sequence("s", list(prompt), n, temperature=1.0, seed=seed)
        for _ in range(n):
            engine.step([seq])
        return seq.token_ids

    whole = sample(prompts[0], 12, seed=3)
    head = sample(prompts[0], 5, seed=3)
    assert head + sample(prompts[0] + head, 7, seed=3) == whole
    assert len({tuple(sample(prompts[0], 12, seed=s)) for s in range(4)}) > 1  # the seed does choose the stream


def test_a_sequences_log_probs_do_not_depend_on_its_neighbours_to_the_last_bit(assets, prompts):
    """Sampling draws from each request's own seed, so a sequence's tokens stay the same however requests
    are batched only if its logits do, bit for bit: beside longer or shorter neighbours (which a padded batch would
    make it attend past) its log-probs equal those it gets alone."""
    from jigsaw_verl.integration.cpu.rollout.engine import CPUGenerationEngine, Sequence

    server = _server(assets)
    engine = CPUGenerationEngine(server.model, eos_token_ids=set())

    def decode(batch: list[list[int]]) -> list[float]:
        seqs = [Sequence(str(i), ids, 6, temperature=0.0) for i, ids in enumerate(batch)]
        for _ in range(6):
            engine.step(seqs)
        return seqs[0].log_probs

    alone = decode([prompts[0]])
    longer = prompts[0] + prompts[1]
    assert decode([prompts[0], longer, prompts[2][:5], prompts[0]]) == alone
