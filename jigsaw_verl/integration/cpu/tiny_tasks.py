"""The tiny tasks the CPU backend's local assets are built for: what a prompt asks, its answer, and the model shape.

- ``arith``: one-step word problems ("Ann has 3 pens and gets 4 more..."); the answer is one number, so every
  response is 2-3 tokens long. The tests' default: cheap, and enough to learn from.
- ``countdown``: "Count down from N." with the answer ``N N-1 ... 1``; ``N`` is drawn log-normal (median
  :data:`COUNTDOWN_MEDIAN`, :data:`COUNTDOWN_SIGMA`, at most :data:`COUNTDOWN_MAX`), so most responses are a few
  tokens and a few of each step's are a hundred or more: a rollout with a real long tail on the CPU, as long-CoT RL
  has on GPUs. Each number is one token, and the model is larger than ``arith``'s so that a decode step and a
  training step take visible time.

Each task is a frozen :class:`TinyTask`; :mod:`jigsaw_verl.integration.cpu.assets` builds its tokenizer, model,
warm start and parquet files, and :mod:`jigsaw_verl.integration.cpu.reward` scores it by its ``data_source``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

NAMES = ["Ann", "Bo", "Cy", "Dee", "Eli", "Fay", "Gus", "Hal"]
ITEMS = ["apples", "pens", "coins", "books", "cards", "shells"]
# countdown lengths: log-normal around the median, cut at the maximum (a response is N + 1 tokens)
COUNTDOWN_MEDIAN = 4
COUNTDOWN_SIGMA = 1.6
COUNTDOWN_MAX = 150


@dataclass(frozen=True)
class ModelShape:
    """A Qwen2 model's size (see ``transformers.Qwen2Config``)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    max_position_embeddings: int


@dataclass(frozen=True)
class TinyTask:
    """A tiny task: its problems, its reward's data source and the model built for it.

    Attributes:
        name: the task's name (``build_tiny_assets(task=...)``).
        data_source: the rows' ``data_source``, which the reward function dispatches on.
        problem: a random problem: ``(question, answer)``, the answer as the response should spell it.
        instruction: appended to each question in the prompt.
        vocab_size: the byte-level BPE's vocabulary.
        shape: the model's size.
        warmup_steps: supervised warm-start steps (loss on the answer and end token).
        warmup_batch: problems per warm-start step.
        warmup_threads: torch threads of the warm start (``None``: torch's default); one is faster than two on a
            busy small machine for a model this small.
        warmup_problem: the warm start's problems, ``(question, answer)`` (``None``: :attr:`problem`).
        whole_tokens: strings the tokenizer keeps whole (one token each, matched longest first before the BPE
            runs): the countdown's numbers, each also with the space before it, so a response is a token a number.
        cache_dir: the folder under the assets root its build is cached in.
        version: part of the build's cache stamp: raise it when the task's build changes.
    """

    name: str
    data_source: str
    problem: Callable[[random.Random], tuple[str, str]]
    instruction: str
    vocab_size: int
    shape: ModelShape
    warmup_steps: int
    warmup_batch: int
    warmup_threads: int | None = None
    warmup_problem: Callable[[random.Random], tuple[str, str]] | None = None
    whole_tokens: tuple[str, ...] = ()
    cache_dir: str = ""
    version: int = 1


def arith_problem(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    if rng.random() < 0.5:
        return f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have?", str(a + b)
    a, b = max(a, b), min(a, b)
    return f"{name} has {a} {item} and gives away {b}. How many {item} are left?", str(a - b)


def countdown_length(rng: random.Random) -> int:
    """A countdown's start: log-normal, heavy-tailed (most a few, a few a hundred or more)."""
    drawn = math.exp(rng.gauss(math.log(COUNTDOWN_MEDIAN), COUNTDOWN_SIGMA))
    return max(1, min(COUNTDOWN_MAX, round(drawn)))


def countdown_answer(n: int) -> str:
    return " ".join(str(k) for k in range(n, 0, -1))


def countdown_problem(rng: random.Random) -> tuple[str, str]:
    n = countdown_length(rng)
    return f"Count down from {n}.", countdown_answer(n)


def countdown_warmup_problem(rng: random.Random) -> tuple[str, str]:
    """Every start equally often, the whole countdown (RL draws the long ones rarely; a window of their first
    numbers only does not teach the rule at the positions far into a long answer)."""
    n = rng.randint(1, COUNTDOWN_MAX)
    return f"Count down from {n}.", countdown_answer(n)


ARITH = TinyTask(
    name="arith",
    data_source="jigsaw/arith",
    problem=arith_problem,
    instruction=" Answer with a number.",
    vocab_size=384,
    shape=ModelShape(96, 288, 2, 3, 512),
    warmup_steps=500,
    warmup_batch=32,
)
COUNTDOWN = TinyTask(
    name="countdown",
    data_source="jigsaw/countdown",
    problem=countdown_problem,
    instruction=" Answer with the numbers.",
    vocab_size=320,
    shape=ModelShape(128, 384, 3, 4, 512),
    warmup_steps=1200,
    warmup_batch=16,
    warmup_threads=1,
    warmup_problem=countdown_warmup_problem,
    whole_tokens=tuple(f"{space}{k}" for k in range(1, COUNTDOWN_MAX + 1) for space in ("", " ")),
    cache_dir="countdown",
    version=2,  # (4, 1.6, 150)
)
TASKS: dict[str, TinyTask] = {t.name: t for t in (ARITH, COUNTDOWN)}


def tiny_task(name: str) -> TinyTask:
    """The task named ``name``; ``ValueError`` (one line, with the known names) otherwise."""
    if name not in TASKS:
        raise ValueError(f"unknown tiny task {name!r} (known: {', '.join(TASKS)})")
    return TASKS[name]
