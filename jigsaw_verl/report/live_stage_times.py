"""Stage times a live run measured, per pipeline, as a replay of another run of the same pipelines needs them.

A baseline run in which each pipeline runs alone on its home (``verl-seq``: both slots, one pipeline after the
other; ``verl-split``: one slot each, side by side on cores of their own) measures what every lease of a pipeline
takes alone: its start-up (:data:`~jigsaw_verl.model.graph.INIT`), its first weight sync, and each step's
rollout, log-prob, update and sync; and how long the trainer works between two of its leases (reward, advantage,
logging: outside every lease). :mod:`jigsaw_verl.runtime.live_replay` replays a group from these. Read from the
run folder's ``leases.json`` (a lease split into slices where its share changed is merged back) and
``stage_times.json`` (each rollout's live-batch curve).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from jigsaw_verl.model.graph import LOGPROB, ROLLOUT, UPDATE, WEIGHT_SYNC


@dataclass(frozen=True)
class AloneTimes:
    """One pipeline's leases when it ran alone on ``slots`` slots.

    Attributes:
        pipeline: its name in the group.
        slots: the slots its home had.
        durations: ``(step, stage)`` -> seconds the lease took (``(-1, "init")`` start-up, ``(-1, "weight_sync")``
            the first sync).
        gaps: stage -> median seconds from the end of a lease of that stage to the pipeline's next lease (the
            trainer's work outside leases; a lease that hands over has none). After start-up it may hold a wait
            for another pipeline too: :func:`~jigsaw_verl.runtime.replay_group.same_start_up_gap` takes the
            shortest.
        finish_offsets: rollout step -> when each response finished, seconds after the rollout's grant.
    """

    pipeline: str
    slots: int
    durations: dict[tuple[int, str], float]
    gaps: dict[str, float]
    finish_offsets: dict[int, tuple[float, ...]]

    def duration(self, step: int, stage: str) -> float:
        """The lease's alone time; a step the run did not reach takes the median of the stage's other steps."""
        if (step, stage) in self.durations:
            return self.durations[(step, stage)]
        same = [d for (k, s), d in self.durations.items() if s == stage and k >= 0]
        if not same:
            raise KeyError(f"{self.pipeline}: the baseline run has no {stage} lease")
        return statistics.median(same)


def merged_leases(leases: list[dict]) -> list[dict]:
    """One record per lease (``leases.json`` has one per segment of constant share), in start order."""
    merged: dict[tuple[str, int, str], dict] = {}
    for s in sorted(leases, key=lambda x: x["start_s"]):
        key = (s["pipeline"], int(s["step"]), s["stage"])
        if key in merged:
            m = merged[key]
            m["start_s"], m["end_s"] = min(m["start_s"], s["start_s"]), max(m["end_s"], s["end_s"])
        else:
            merged[key] = {**s}
    return sorted(merged.values(), key=lambda x: x["start_s"])


def alone_times(folder: str | Path) -> dict[str, AloneTimes]:
    """Per pipeline, the alone times of the baseline run in ``folder`` (``ValueError`` naming the file when it holds
    no lease)."""
    folder = Path(folder)
    leases = merged_leases(json.loads((folder / "leases.json").read_text()))
    if not leases:
        raise ValueError(f"{folder / 'leases.json'}: no lease (did the run fail?)")
    history = json.loads((folder / "stage_times.json").read_text())
    found = {}
    for name in sorted({s["pipeline"] for s in leases}):
        mine = [s for s in leases if s["pipeline"] == name]
        gaps: dict[str, list[float]] = {}
        for a, b in zip(mine, mine[1:], strict=False):
            if not (b["stage"] == ROLLOUT and b["start_s"] - a["end_s"] < 1e-6):  # a handover: no gap
                gaps.setdefault(a["stage"], []).append(max(0.0, b["start_s"] - a["end_s"]))
        offsets = {
            int(h["step"]): tuple(h["finish_offsets_s"])
            for h in history
            if h["pipeline"] == name and h["stage"] == ROLLOUT
        }
        found[name] = AloneTimes(
            pipeline=name,
            slots=len(mine[0]["gpus"]),
            durations={(int(s["step"]), s["stage"]): s["end_s"] - s["start_s"] for s in mine},
            gaps={stage: statistics.median(v) for stage, v in gaps.items()},
            finish_offsets=offsets,
        )
    return found


def steady_chain_s(times: AloneTimes, steps: int) -> float:
    """The least a pipeline's steady state takes, seconds (from its first rollout's grant to its last update's
    end): every step's leases at their alone times, one after the other (the trainer's work between them, which
    varies from step to step, is left out, so no run of these stage times is shorter)."""
    return sum(_steady_leases(times, steps))


def steady_slot_seconds(times: AloneTimes, steps: int) -> float:
    """Slot-seconds its steady-state leases hold alone (slots x seconds)."""
    return times.slots * sum(_steady_leases(times, steps))


def _steady_leases(times: AloneTimes, steps: int) -> list[float]:
    """Every steady-state lease's alone seconds: each step's rollout, log-prob and update, and the syncs between
    steps (verl's trainer syncs before a step: none after the last)."""
    syncs = [times.duration(k, WEIGHT_SYNC) for k in range(steps - 1)]
    return [times.duration(k, s) for k in range(steps) for s in (ROLLOUT, LOGPROB, UPDATE)] + syncs


def makespan_bound_s(widths: dict[int, dict[str, AloneTimes]], num_slots: int, steps: int) -> float:
    """A lower bound on any schedule's steady-state makespan of these pipelines on ``num_slots`` slots, from their
    alone times on each measured home width: no pipeline runs its chain faster than alone on its fastest width, and
    the pool cannot do more slot-seconds of work per second than it has slots, each pipeline needing at least its
    least slot-seconds over the widths. It assumes what time-sharing a slot gives (two leases on one core share its
    seconds; neither gets more work done than alone) and that a lease on a wider home needs no fewer slot-seconds
    than on the narrowest measured one, which holds where a stage does not scale super-linearly."""
    names = sorted(set.intersection(*(set(t) for t in widths.values())))
    chain = max(min(steady_chain_s(w[n], steps) for w in widths.values()) for n in names)
    work = sum(min(steady_slot_seconds(w[n], steps) for w in widths.values()) for n in names)
    return max(chain, work / num_slots)


def shared_home_bound_s(times: dict[str, AloneTimes], homes: dict[str, tuple[int, ...]], steps: int) -> float:
    """A lower bound on the steady-state makespan of pipelines living on ``homes`` under the live executor, from
    their alone times on their own homes: pipelines with the same home never roll out at once (no two rollouts
    share a slot, a rollout starts on its pipeline's whole home and holds a slot of it until it ends), so their
    rollouts take at least the sum of their alone times."""
    by_home: dict[tuple[int, ...], float] = {}
    for name, home in homes.items():
        rollouts = sum(times[name].duration(k, ROLLOUT) for k in range(steps))
        by_home[tuple(home)] = by_home.get(tuple(home), 0.0) + rollouts
    return max(by_home.values(), default=0.0)
