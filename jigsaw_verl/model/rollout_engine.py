"""A continuous-batching rollout replica (vLLM-like), advanced event by event in closed form.

Between two events the set of live sequences is constant, so a run of decode steps is one closed-form segment
(:meth:`CostModel.decode_segment`). Events are: a segment ends because the shortest live response finishes, an
admitted set finishes prefill, a weight load ends, or something arrives from outside (new requests, an
interrupt), in which case the decode step in flight completes first.

Modelling assumptions (vLLM v1 with verl's settings):
- Requests wait in FIFO order and are admitted while the replica has fewer than ``max_num_seqs`` live sequences
  and the final KV of every admitted sequence fits the KV capacity. This idealises vLLM's on-demand paging:
  no preemption ever happens, which matches vLLM whenever it does not preempt and flatters it slightly when it
  would.
- Admitted prompts are prefilled together, pausing decode (chunked prefill would interleave them; the total is
  the same). Prefill yields a sequence's first token. A resumed sequence (interrupted or migrated) is re-prefilled
  over prompt + tokens so far and yields its next token: KV is recomputed, never transferred.
- The engine knows each response's true length only to decide when it ends; no admission uses it beyond the
  KV fit above.

The engine is the mechanism: it never decides where requests go. It is shared by the simulator and by the
sub-stage graph builder, so predicted and simulated rollouts agree by construction.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from jigsaw_verl.model.catalogue import ModelSpec
from jigsaw_verl.model.cost_model import CostModel, Work

# Decode phases are cut where the live batch of a replica crosses these sizes.
DECODE_BUCKET_EDGES: tuple[int, ...] = (1, 4, 16, 64, 256, 1024)


def decode_phase(batch: int) -> str:
    """Sub-stage name of a decode step with ``batch`` live sequences, e.g. ``decode[16,64)``."""
    lo = DECODE_BUCKET_EDGES[0]
    for hi in DECODE_BUCKET_EDGES[1:]:
        if batch < hi:
            return f"decode[{lo},{hi})"
        lo = hi
    return f"decode[{lo},inf)"


@dataclass(frozen=True)
class Request:
    """One response to generate.

    Attributes:
        step: the training step whose batch it belongs to.
        index: position in that step's batch.
        prompt_len: prompt tokens.
        response_len: tokens the response will have when finished.
    """

    step: int
    index: int
    prompt_len: int
    response_len: int


@dataclass(frozen=True)
class Activity:
    """What a replica did over ``[start_s, end_s)``: a prefill, a decode segment or a weight load.

    Attributes:
        kind: ``prefill`` | ``reprefill`` | ``decode[a,b)`` | ``weight_load``.
        start_s: begin, seconds.
        end_s: end, seconds.
        batch: live sequences (decode) or sequences prefilled.
        tokens: tokens produced.
        work: resource seconds used.
        useful_flops: model FLOPs that count towards MFU (re-prefill does not).
    """

    kind: str
    start_s: float
    end_s: float
    batch: int
    tokens: int
    work: Work
    useful_flops: float


@dataclass
class _Live:
    req: Request
    generated: int
    needs_prefill: bool


class ReplicaEngine:
    """One rollout replica of ``tp`` GPUs.

    Args:
        cost: the cost model.
        model: the served model.
        tp: tensor-parallel size.
        kv_capacity_tokens: KV-cache tokens the replica holds.
        max_num_seqs: live sequence limit (verl's rollout default is 1024).
    """

    def __init__(self, cost: CostModel, model: ModelSpec, tp: int, kv_capacity_tokens: int, max_num_seqs: int = 1024):
        self.cost, self.model, self.tp = cost, model, tp
        self.coeffs = cost.decode_coeffs(model, tp)
        self.kv_capacity = kv_capacity_tokens
        self.max_num_seqs = max_num_seqs
        self.queue: deque[_Live] = deque()
        self.live: list[_Live] = []
        self.kv_reserved = 0
        self.clock = 0.0
        self._act: tuple | None = None  # (kind, start, end, payload)
        self._pending_load: float | None = None  # seconds of a weight load to run before anything else
        self.reprefill_tokens = 0
        self.generated_tokens = 0
        self.version = 0  # bumped by every call that may change its sequences (what a replica view shows)

    # ---- inputs ----------------------------------------------------------------------------------------------
    def submit(self, requests: list[Request], now: float) -> None:
        """Queue ``requests`` at ``now``; a decode step in flight completes before they are admitted."""
        self.version += 1
        for r in requests:
            if r.prompt_len + r.response_len > self.kv_capacity:
                raise ValueError(
                    f"request of {r.prompt_len + r.response_len} tokens exceeds KV capacity {self.kv_capacity}"
                )
            self.queue.append(_Live(r, 0, True))
        self._cut(now)

    def resume(self, request: Request, generated: int, now: float) -> None:
        """Queue a request that already has ``generated`` tokens elsewhere (it will be re-prefilled)."""
        self.version += 1
        self.queue.append(_Live(request, generated, True))
        self._cut(now)

    def abort(self, now: float) -> tuple[list[tuple[Request, int]], list[Activity]]:
        """Stop at ``now`` and hand back every request with the tokens it has so far, live ones first, then the
        queue (the migration path: the caller resumes them elsewhere with :meth:`resume`). Decode steps completed
        by ``now`` count; a step, prefill or weight load in flight is lost, its time spent. The replica is left
        empty.

        Returns:
            ``(request, tokens generated so far)`` per request, and the activities completed or cut short.
        """
        self.version += 1
        acts: list[Activity] = []
        if self._act is not None:
            kind, start, end, payload = self._act
            if kind.startswith("decode"):
                steps, _ = payload
                batch, ctx0 = len(self.live), self._ctx()
                n = self.cost.decode_steps_until(self.coeffs, batch, ctx0, now - start, steps)
                if self.cost.decode_segment(self.coeffs, batch, ctx0, n) > now - start + 1e-12:
                    n -= 1  # the step in flight at ``now`` is lost
                if n > 0:
                    dur = self.cost.decode_segment(self.coeffs, batch, ctx0, n)
                    work = self.cost.decode_work(self.coeffs, self.tp, n, batch * n, n * ctx0 + batch * n * (n - 1) / 2)
                    for s in self.live:
                        s.generated += n
                    self.generated_tokens += n * batch
                    flops = 2.0 * self.model.params * n * batch
                    acts.append(Activity(kind, start, start + dur, batch, n * batch, work, flops))
            elif now > start:
                acts.append(Activity(f"{kind}(aborted)", start, now, 0, 0, Work(), 0.0))
        out = [(s.req, s.generated) for s in self.live] + [(s.req, s.generated) for s in self.queue]
        self.live, self.queue, self.kv_reserved, self._act, self._pending_load = [], deque(), 0, None, None
        self.clock = max(self.clock, now)
        return out, acts

    def load_weights(self, now: float, duration_s: float, *, interrupt: bool) -> None:
        """Pause for a weight update of ``duration_s`` after the step in flight; with ``interrupt`` every live
        sequence is re-prefilled under the new weights afterwards (AReaL's interruptible rollout)."""
        self.version += 1
        if interrupt:
            for s in self.live:
                s.needs_prefill = True
        self._pending_load = duration_s
        self._cut(now)

    # ---- queries ---------------------------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return bool(self.live or self.queue or self._act is not None)

    @property
    def context_tokens(self) -> int:
        """Prompt + generated tokens of the live sequences (the KV they hold now)."""
        return int(self._ctx())

    @property
    def live_generated(self) -> int:
        """Tokens generated so far by the live sequences."""
        return sum(s.generated for s in self.live)

    @property
    def live_count(self) -> int:
        return len(self.live)

    @property
    def outstanding(self) -> int:
        """Live plus queued requests (what a least-loaded balancer looks at)."""
        return len(self.live) + len(self.queue)

    def current_load(self) -> tuple[Work, float]:
        """Resource seconds and duration of the activity in flight (``(Work(), 0.0)`` when idle or loading), for
        the co-location speed model."""
        if self._act is None or self._act[0] == "weight_load":
            return Work(), 0.0
        kind, start, end, payload = self._act
        return payload[1], end - start

    def next_event_s(self) -> float | None:
        """When the current activity ends, or ``None`` when idle."""
        return None if self._act is None else self._act[2]

    # ---- advancing -------------------------------------------------------------------------------------------
    def advance(self, now: float) -> tuple[list[tuple[Request, float, int]], list[Activity]]:
        """Finish the activity ending at ``now`` (if any) and start the next one.

        Returns:
            The requests that finished (request, finish time, tokens generated) and the activities completed.
        """
        self.version += 1
        done: list[tuple[Request, float, int]] = []
        acts: list[Activity] = []
        if self._act is not None and self._act[2] <= now + 1e-12:
            acts.append(self._complete(done))
        if self._act is None:
            self.clock = max(self.clock, now)
            self._start_next()
        return done, acts

    def _complete(self, done: list) -> Activity:
        kind, start, end, payload = self._act
        self._act = None
        self.clock = end
        if kind == "weight_load":
            return Activity(kind, start, end, len(self.live), 0, Work(), 0.0)
        if kind in ("prefill", "reprefill"):
            seqs, work, useful = payload
            for s in seqs:
                s.needs_prefill = False
                s.generated += 1
            tokens = len(seqs)
            batch = len(seqs)
        else:
            steps, work = payload
            for s in self.live:
                s.generated += steps
            tokens = steps * len(self.live)
            batch = len(self.live)
            useful = 2.0 * self.model.params * tokens
        self.generated_tokens += tokens
        still = []
        for s in self.live:
            if s.generated >= s.req.response_len:
                done.append((s.req, end, s.generated))
                self.kv_reserved -= s.req.prompt_len + s.req.response_len
            else:
                still.append(s)
        self.live = still
        return Activity(kind, start, end, batch, tokens, work, useful)

    def _start_next(self) -> None:
        t = self.clock
        if self._pending_load is not None:
            self._act = ("weight_load", t, t + self._pending_load, None)
            self._pending_load = None
            return
        while self.queue and len(self.live) < self.max_num_seqs:
            head = self.queue[0]
            need = head.req.prompt_len + head.req.response_len
            if self.kv_reserved + need > self.kv_capacity:
                break
            self.queue.popleft()
            self.kv_reserved += need
            self.live.append(head)
        fresh = [s for s in self.live if s.needs_prefill]
        if fresh:
            ctx = [s.req.prompt_len + s.generated for s in fresh]
            tokens, sum_sq = float(sum(ctx)), float(sum(c * c for c in ctx))
            reprefill = [s for s in fresh if s.generated > 0]
            re_tokens = sum(s.req.prompt_len + s.generated for s in reprefill)
            self.reprefill_tokens += re_tokens
            useful = 2.0 * self.model.params * (tokens - re_tokens)
            kind = "reprefill" if reprefill and len(reprefill) == len(fresh) else "prefill"
            dur = self.cost.prefill(self.model, self.tp, tokens, sum_sq)
            self._act = (kind, t, t + dur, (fresh, self.cost.prefill_work(self.model, tokens, sum_sq), useful))
            return
        if not self.live:
            if self.queue:
                raise RuntimeError("replica deadlocked: the head request cannot be admitted into an empty replica")
            return
        steps = min(s.req.response_len - s.generated for s in self.live)
        self._start_decode(t, steps)

    def _ctx(self) -> float:
        return float(sum(s.req.prompt_len + s.generated for s in self.live))

    def _start_decode(self, t: float, steps: int) -> None:
        batch, ctx0 = len(self.live), self._ctx()
        dur = self.cost.decode_segment(self.coeffs, batch, ctx0, steps)
        ctx_sum = steps * ctx0 + batch * steps * (steps - 1) / 2.0
        work = self.cost.decode_work(self.coeffs, self.tp, steps, batch * steps, ctx_sum)
        self._act = (decode_phase(batch), t, t + dur, (steps, work))

    def _cut(self, now: float) -> None:
        """Something arrived at ``now``: if decoding, shorten the segment to the step in flight at ``now``;
        if idle, start at ``now``."""
        if self._act is None:
            self.clock = max(self.clock, now)
            self._start_next()
            return
        kind, start, end, payload = self._act
        if not kind.startswith("decode") or end <= now:
            return
        steps, _ = payload
        batch, ctx0 = len(self.live), self._ctx()
        keep = self.cost.decode_steps_until(self.coeffs, batch, ctx0, now - start, steps)
        if keep < steps:
            self._start_decode(start, keep)
