"""A continuous-batching generation engine on the CPU with transformers (no Ray, no verl).

Every :meth:`CPUGenerationEngine.step` runs one decode step for all live sequences together: new requests join
the batch at the next step and finished ones leave it (continuous batching). The step recomputes each
sequence's full context instead of keeping a KV cache (the tiny CPU models make that cheap), one forward pass per
group of equal context length, without padding: a sequence's logits then do not depend on its neighbours, so
decoding gives the same text however requests are batched, aborted or resumed. Sampling is counter-based: the token
at context position p of a request with seed s is drawn from a generator seeded by (s, p), so a request resumed as
prompt + tokens so far with the same seed continues the very stream it was cut from (vLLM, by contrast, restarts a
seeded request's stream at a resume).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import torch


@dataclass
class Sequence:
    """One request in flight.

    Attributes:
        request_id: the caller's id.
        prompt_ids: prompt (for a resumed request: prompt + tokens generated elsewhere).
        max_tokens: tokens it may still generate.
        temperature: 0 means greedy.
        top_p: nucleus mass.
        top_k: -1 or 0 means no top-k.
        ignore_eos: keep generating past end tokens until ``max_tokens``.
        seed: the request's sampling seed; token p of its context is drawn with seed (seed, p) (sampling only).
        token_ids: tokens generated here.
        log_probs: log-probability of each generated token under the (temperature-scaled) distribution.
        finished: why it stopped, once it has: ``completed`` or ``aborted``.
    """

    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    ignore_eos: bool = False
    seed: int | None = None
    token_ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    finished: str | None = None


def request_seed(*parts: object) -> int:
    """A stable 63-bit seed from any parts (request id, step, run seed)."""
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


class CPUGenerationEngine:
    """Batched next-token generation for a causal LM on the CPU.

    Args:
        model: a transformers causal LM (eval mode, float32).
        eos_token_ids: tokens that end a response.
        max_num_seqs: sequences decoded together at most; the rest wait.
    """

    def __init__(self, model: torch.nn.Module, *, eos_token_ids: set[int], max_num_seqs: int = 256):
        self.model = model
        self.eos = set(eos_token_ids)
        self.max_num_seqs = max_num_seqs

    @torch.no_grad()
    def step(self, seqs: list[Sequence]) -> None:
        """Generate one token for each of ``seqs`` (at most ``max_num_seqs``) and mark the ones that end.

        Sequences are decoded in groups of equal context length, each group one forward pass without padding: a
        left-padded batch gives a sequence slightly different logits (float rounding) depending on its neighbours'
        lengths, so which requests happened to share a step would change sampled tokens, and a multiplexed run
        would no longer compute what the pipeline computes alone."""
        if not seqs:
            return
        groups: dict[int, list[Sequence]] = {}
        for s in seqs:
            groups.setdefault(len(s.prompt_ids) + len(s.token_ids), []).append(s)
        for group in groups.values():
            ids = torch.tensor([s.prompt_ids + s.token_ids for s in group], dtype=torch.long)
            logits = self.model(input_ids=ids).logits[:, -1, :].float()
            for i, s in enumerate(group):
                token, logprob = self._sample(logits[i], s)
                s.token_ids.append(token)
                s.log_probs.append(logprob)
                if (token in self.eos and not s.ignore_eos) or len(s.token_ids) >= s.max_tokens:
                    s.finished = "completed"

    def _sample(self, logits: torch.Tensor, s: Sequence) -> tuple[int, float]:
        if s.temperature <= 0:
            logp = torch.log_softmax(logits, -1)
            token = int(torch.argmax(logits))
            return token, float(logp[token])
        scaled = logits / s.temperature
        logp = torch.log_softmax(scaled, -1)
        probs = logp.exp()
        keep = torch.ones_like(probs, dtype=torch.bool)
        if s.top_k and s.top_k > 0 and s.top_k < probs.numel():
            keep &= probs >= torch.topk(probs, s.top_k).values[-1]
        if s.top_p < 1.0:
            order = torch.argsort(probs, descending=True)
            cum = torch.cumsum(probs[order], 0)
            drop = cum - probs[order] > s.top_p
            keep[order[drop]] = False
        filtered = torch.where(keep, probs, torch.zeros_like(probs))
        position = len(s.prompt_ids) + len(s.token_ids)
        generator = torch.Generator().manual_seed(request_seed(s.seed, position))
        token = int(torch.multinomial(filtered / filtered.sum(), 1, generator=generator))
        return token, float(logp[token])
