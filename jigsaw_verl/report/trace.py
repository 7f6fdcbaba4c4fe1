"""Chrome / Perfetto trace export of simulated and live runs: one process per run, one track per slot, one slice per
sub-stage (simulated) or lease segment (live)."""

from __future__ import annotations

import json
from pathlib import Path

from jigsaw_verl.pool.timeline import Timeline


def trace_events(timelines: dict[str, Timeline]) -> list[dict]:
    """Trace events (microseconds) for ``timelines``; slices are named ``pipeline/step/stage``."""
    events: list[dict] = []
    for pid, (name, r) in enumerate(timelines.items(), start=1):
        events.append({"ph": "M", "pid": pid, "name": "process_name", "args": {"name": f"{name} ({r.label})"}})
        for g in range(r.num_slots):
            events.append({"ph": "M", "pid": pid, "tid": g, "name": "thread_name", "args": {"name": f"slot {g}"}})
        for s in r.slices:
            for g in s.gpus:
                events.append(
                    {
                        "ph": "X",
                        "pid": pid,
                        "tid": g,
                        "name": f"{s.pipeline}/{s.step}/{s.stage}",
                        "cat": s.bound,
                        "ts": round(s.start_s * 1e6, 3),
                        "dur": round((s.end_s - s.start_s) * 1e6, 3),
                        "args": {"sub_stage": s.name, "bound": s.bound},
                    }
                )
    return events


def write_trace(timelines: dict[str, Timeline], path: str | Path, extra_events: list[dict] = ()) -> None:
    """Write a trace that chrome://tracing and ui.perfetto.dev open (``extra_events``: more events, e.g. counters)."""
    events = trace_events(timelines) + list(extra_events)
    Path(path).write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))
