"""Tiny local assets for CPU runs: a byte-level BPE tokenizer, a random Qwen2 model and a dataset of a tiny task.

Nothing is downloaded: everything is built deterministically from a seed in seconds and cached under
``$JIGSAW_VERL_ASSETS`` (default ``~/.cache/jigsaw_verl/tiny``; a task other than ``arith`` in a folder of its
own there). The tasks are :mod:`jigsaw_verl.integration.cpu.tiny_tasks`' (``arith``: one-number answers;
``countdown``: heavy-tailed answer lengths). The model starts random and gets a short supervised warm start on
problems of the same kind (the task's ``warmup_steps``), so that RL begins where some answers are right and some
wrong: a fully random model never answers right, every GRPO advantage is zero and nothing would be learned or
tested. The dataset is in verl's RL parquet format (``data_source``, chat ``prompt``, ``ability``,
``reward_model.ground_truth``, ``extra_info``); its rule-based reward is
:func:`jigsaw_verl.integration.cpu.reward.compute_score`.
"""

from __future__ import annotations

import fcntl
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

from jigsaw_verl.integration.cpu.tiny_tasks import ARITH, TinyTask, tiny_task

ASSET_VERSION = 4
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


@dataclass(frozen=True)
class TinyAssets:
    """Paths of the built assets.

    Attributes:
        root: the cache folder.
        model: HF model folder (config, weights, tokenizer).
        train_file: training parquet.
        val_file: validation parquet.
    """

    root: Path
    model: Path
    train_file: Path
    val_file: Path


def default_root() -> Path:
    return Path(os.environ.get("JIGSAW_VERL_ASSETS", Path.home() / ".cache" / "jigsaw_verl" / "tiny"))


def _rows(task: TinyTask, n: int, rng: random.Random, split: str) -> list[dict]:
    rows = []
    for i in range(n):
        question, answer = task.problem(rng)
        rows.append(
            {
                "data_source": task.data_source,
                "prompt": [{"role": "user", "content": question + task.instruction}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": answer},
                "extra_info": {"split": split, "index": i, "answer": answer, "question": question},
            }
        )
    return rows


def _build_tokenizer(task: TinyTask, rng: random.Random, out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = []
    for _ in range(3000):
        q, a = task.problem(rng)
        corpus.append(f"<|im_start|>user\n{q}{task.instruction}<|im_end|>\n<|im_start|>assistant\n{a}<|im_end|>")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=task.vocab_size, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        additional_special_tokens=["<|im_start|>"],
    )
    if task.whole_tokens:
        fast.add_tokens(list(task.whole_tokens))
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def _build_model(task: TinyTask, tokenizer, seed: int, out: Path) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=task.shape.hidden_size,
        intermediate_size=task.shape.intermediate_size,
        num_hidden_layers=task.shape.num_hidden_layers,
        num_attention_heads=task.shape.num_attention_heads,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=task.shape.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    model = Qwen2ForCausalLM(config)
    _warm_start(task, model, tokenizer, random.Random(seed + 1), seed)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out, safe_serialization=True)


WARMUP_LR = 3e-3


def _warm_start(task: TinyTask, model, tokenizer, rng: random.Random, seed: int) -> None:
    """Supervised steps on fresh problems: loss on the answer and end token only."""
    import torch

    torch.manual_seed(seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(task.warmup_threads or threads)
    opt = torch.optim.AdamW(model.parameters(), lr=WARMUP_LR)
    model.train()
    problem = task.warmup_problem or task.problem
    for _ in range(task.warmup_steps):
        rows, width = [], 0
        for _ in range(task.warmup_batch):
            q, a = problem(rng)
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": q + task.instruction}], add_generation_prompt=True, tokenize=False
            )
            prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
            answer = tokenizer(a, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            rows.append((prompt, answer))
            width = max(width, len(prompt) + len(answer))
        ids = torch.full((len(rows), width), tokenizer.pad_token_id)
        labels = torch.full((len(rows), width), -100)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, (p, a) in enumerate(rows):
            seq = p + a
            ids[i, : len(seq)] = torch.tensor(seq)
            labels[i, len(p) : len(seq)] = torch.tensor(a)
            mask[i, : len(seq)] = 1
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    torch.set_num_threads(threads)


def build_tiny_assets(
    root: str | Path | None = None, *, task: str = "arith", seed: int = 0, train_rows: int = 256, val_rows: int = 32
) -> TinyAssets:
    """Build ``task``'s assets under ``root`` (default: :func:`default_root`, then the task's folder) unless an
    identical build is already there; return their paths."""
    import pandas as pd

    spec = tiny_task(task)
    root = Path(root) if root is not None else default_root() / spec.cache_dir
    assets = TinyAssets(root, root / "model", root / "train.parquet", root / "val.parquet")
    stamp = root / "BUILD.json"
    want = {"version": ASSET_VERSION, "seed": seed, "train_rows": train_rows, "val_rows": val_rows}
    if spec is not ARITH:
        want["task"] = f"{spec.name}/{spec.version}"
    if stamp.exists() and json.loads(stamp.read_text()) == want:
        return assets
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".build.lock").open("w") as lock:
        # processes that need the assets at once (a group's recipes are checked together) build them in turn: the
        # first builds, the others find its stamp
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.exists() and json.loads(stamp.read_text()) == want:
            return assets
        rng = random.Random(seed)
        assets.model.mkdir(parents=True, exist_ok=True)
        tokenizer = _build_tokenizer(spec, rng, assets.model)
        _build_model(spec, tokenizer, seed, assets.model)
        pd.DataFrame(_rows(spec, train_rows, rng, "train")).to_parquet(assets.train_file)
        pd.DataFrame(_rows(spec, val_rows, rng, "test")).to_parquet(assets.val_file)
        stamp.write_text(json.dumps(want))
    return assets


if __name__ == "__main__":
    import sys

    a = build_tiny_assets(task=sys.argv[1] if len(sys.argv) > 1 else "arith")
    print(a.model, a.train_file, a.val_file)
