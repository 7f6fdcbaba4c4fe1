"""What a multiplexed live run measured, read back from the files ``jigsaw-verl mux`` writes in its output folder.

``leases.json`` (every lease: slots, start and end, pipeline, step, stage) gives the steady-state makespan (from
the first step's first stage to the last step's last stage: start-up and validation are not in it), the slots'
busy fraction and each pipeline's step times; ``<pipeline>.metrics.jsonl`` (verl's file logger) gives the
response lengths, hence the tokens generated. Nothing here starts Ray or verl: the benchmark and the tests read
finished runs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from jigsaw_verl.model.graph import STAGES


@dataclass(frozen=True)
class PipelineRun:
    """One pipeline of a live run.

    Attributes:
        name: the pipeline's name in the group.
        steps: steps it ran.
        step_s: per step, from its first stage's lease to its last stage's end, seconds.
        response_tokens: tokens it generated over all its steps.
        response_lengths: per step, the mean response length (verl's ``response_length/mean``).
    """

    name: str
    steps: int
    step_s: tuple[float, ...]
    response_tokens: float
    response_lengths: tuple[float, ...]

    @property
    def mean_step_s(self) -> float:
        return sum(self.step_s) / len(self.step_s) if self.step_s else 0.0


@dataclass(frozen=True)
class LiveRun:
    """A live run's measurements.

    Attributes:
        makespan_s: first step's first lease to the last step's last lease end, seconds (steady state).
        wall_s: the launcher's wall time, start-up included, seconds (``None`` when not given).
        busy_fraction: slot-seconds under a lease in the steady-state window over slots x makespan.
        pipelines: per pipeline, by name.
    """

    makespan_s: float
    wall_s: float | None
    busy_fraction: float
    pipelines: dict[str, PipelineRun]

    @property
    def tokens_per_s(self) -> float:
        tokens = sum(p.response_tokens for p in self.pipelines.values())
        return tokens / self.makespan_s if self.makespan_s > 0 else 0.0


def _step_leases(leases: list[dict]) -> list[dict]:
    """The leases of the step graph (start-up, validation and the sync before the first step are not)."""
    return [s for s in leases if s["stage"] in STAGES and int(s["step"]) >= 0]


def _busy_slot_seconds(leases: list[dict], start: float, end: float, num_slots: int) -> float:
    """Per slot, the union of its leases' intervals within ``[start, end]``, summed over the slots."""
    total = 0.0
    for slot in range(num_slots):
        spans = sorted((max(start, s["start_s"]), min(end, s["end_s"])) for s in leases if slot in s["gpus"])
        reach = start
        for a, b in spans:
            a = max(a, reach)
            if b > a:
                total += b - a
                reach = b
    return total


def _pipeline(
    name: str, leases: list[dict], lengths: tuple[float, ...], group_size: int, batch_prompts: int
) -> PipelineRun:
    mine = [s for s in leases if s["pipeline"] == name]
    steps = sorted({int(s["step"]) for s in mine})
    step_s = tuple(
        max(s["end_s"] for s in mine if s["step"] == k) - min(s["start_s"] for s in mine if s["step"] == k)
        for k in steps
    )
    tokens = sum(lengths) * group_size * batch_prompts
    return PipelineRun(name, len(steps), step_s, tokens, lengths)


def response_lengths(metrics: Path) -> tuple[float, ...]:
    """Per step, the mean response length verl logged (``response_length/mean`` of ``<pipeline>.metrics.jsonl``)."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
    return tuple(float(r["data"]["response_length/mean"]) for r in rows if "response_length/mean" in r["data"])


def live_run_of(
    leases: list[dict],
    num_slots: int,
    lengths: dict[str, tuple[float, ...]],
    *,
    group_size: int,
    batch_prompts: int,
    wall_s: float | None = None,
    source: str = "leases",
) -> LiveRun:
    """The measurements of a run whose leases are ``leases`` (``leases.json`` records, live or replayed) and whose
    pipelines' mean response lengths per step are ``lengths``."""
    leases = _step_leases(leases)
    if not leases:
        raise ValueError(f"{source}: no lease of a training step (did the run fail?)")
    start = min(s["start_s"] for s in leases)
    end = max(s["end_s"] for s in leases)
    busy = _busy_slot_seconds(leases, start, end, num_slots)
    names = sorted({s["pipeline"] for s in leases})
    pipelines = {n: _pipeline(n, leases, lengths.get(n, ()), group_size, batch_prompts) for n in names}
    return LiveRun(end - start, wall_s, busy / (num_slots * (end - start)), pipelines)


def read_live_run(
    folder: str | Path, num_slots: int, *, group_size: int, batch_prompts: int, wall_s: float | None = None
) -> LiveRun:
    """The measurements of the run whose files are in ``folder`` (``leases.json``, ``<pipeline>.metrics.jsonl``);
    ``group_size`` and ``batch_prompts`` (responses per prompt, prompts per step) turn verl's mean response length
    into tokens."""
    folder = Path(folder)
    leases = json.loads((folder / "leases.json").read_text())
    names = {s["pipeline"] for s in leases}
    lengths = {n: response_lengths(folder / f"{n}.metrics.jsonl") for n in names}
    return live_run_of(
        leases,
        num_slots,
        lengths,
        group_size=group_size,
        batch_prompts=batch_prompts,
        wall_s=wall_s,
        source=str(folder / "leases.json"),
    )
