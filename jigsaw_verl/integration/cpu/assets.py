"""Tiny local assets for CPU runs: a byte-level BPE tokenizer, a random Qwen2 model and an arithmetic dataset.

Nothing is downloaded: everything is built deterministically from a seed in a few seconds and cached under
``$JIGSAW_VERL_ASSETS`` (default ``~/.cache/jigsaw_verl/tiny``). The model starts random and gets a short
supervised warm start on problems of the same kind (``WARMUP_STEPS``), so that RL begins where some answers are
right and some wrong: a fully random model never answers right, every GRPO advantage is zero and nothing would
be learned or tested. The dataset is in verl's RL parquet format
(``data_source``, chat ``prompt``, ``ability``, ``reward_model.ground_truth``, ``extra_info``); its rule-based
reward is :func:`jigsaw_verl.integration.cpu.reward.compute_score` (1 for the correct final number, else 0).
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

ASSET_VERSION = 4
DATA_SOURCE = "jigsaw/arith"
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
NAMES = ["Ann", "Bo", "Cy", "Dee", "Eli", "Fay", "Gus", "Hal"]
ITEMS = ["apples", "pens", "coins", "books", "cards", "shells"]


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


def _problem(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    if rng.random() < 0.5:
        return f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have?", a + b
    a, b = max(a, b), min(a, b)
    return f"{name} has {a} {item} and gives away {b}. How many {item} are left?", a - b


def _rows(n: int, rng: random.Random, split: str) -> list[dict]:
    rows = []
    for i in range(n):
        question, answer = _problem(rng)
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": question + " Answer with a number."}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(answer)},
                "extra_info": {"split": split, "index": i, "answer": str(answer), "question": question},
            }
        )
    return rows


def _build_tokenizer(rng: random.Random, out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = []
    for _ in range(3000):
        q, a = _problem(rng)
        corpus.append(f"<|im_start|>user\n{q} Answer with a number.<|im_end|>\n<|im_start|>assistant\n{a}<|im_end|>")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=384, special_tokens=SPECIAL_TOKENS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        additional_special_tokens=["<|im_start|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def _build_model(tokenizer, seed: int, out: Path) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=96,
        intermediate_size=288,
        num_hidden_layers=2,
        num_attention_heads=3,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    model = Qwen2ForCausalLM(config)
    _warm_start(model, tokenizer, random.Random(seed + 1), seed)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out, safe_serialization=True)


WARMUP_STEPS = 500
WARMUP_BATCH = 32
WARMUP_LR = 3e-3


def _warm_start(model, tokenizer, rng: random.Random, seed: int) -> None:
    """Supervised steps on fresh problems: loss on the answer and end token only."""
    import torch

    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=WARMUP_LR)
    model.train()
    for _ in range(WARMUP_STEPS):
        rows, width = [], 0
        for _ in range(WARMUP_BATCH):
            q, a = _problem(rng)
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": q + " Answer with a number."}], add_generation_prompt=True, tokenize=False
            )
            prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
            answer = tokenizer(str(a), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
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


def build_tiny_assets(
    root: str | Path | None = None, *, seed: int = 0, train_rows: int = 256, val_rows: int = 32
) -> TinyAssets:
    """Build the assets under ``root`` unless an identical build is already there; return their paths."""
    import pandas as pd

    root = Path(root) if root is not None else default_root()
    assets = TinyAssets(root, root / "model", root / "train.parquet", root / "val.parquet")
    stamp = root / "BUILD.json"
    want = {"version": ASSET_VERSION, "seed": seed, "train_rows": train_rows, "val_rows": val_rows}
    if stamp.exists() and json.loads(stamp.read_text()) == want:
        return assets
    rng = random.Random(seed)
    assets.model.mkdir(parents=True, exist_ok=True)
    tokenizer = _build_tokenizer(rng, assets.model)
    _build_model(tokenizer, seed, assets.model)
    pd.DataFrame(_rows(train_rows, rng, "train")).to_parquet(assets.train_file)
    pd.DataFrame(_rows(val_rows, rng, "test")).to_parquet(assets.val_file)
    stamp.write_text(json.dumps(want))
    return assets


if __name__ == "__main__":
    a = build_tiny_assets()
    print(a.model, a.train_file, a.val_file)
