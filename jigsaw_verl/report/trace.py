"""Chrome / Perfetto trace export: one process per policy, one track per GPU, one slice per sub-stage."""

from __future__ import annotations

import json
from pathlib import Path

from jigsaw_verl.sim.simulator import SimResult


def trace_events(results: dict[str, SimResult]) -> list[dict]:
    """Trace events (microseconds) for ``results``; slices are named ``pipeline/step/stage``."""
    events: list[dict] = []
    for pid, (name, r) in enumerate(results.items(), start=1):
        events.append({"ph": "M", "pid": pid, "name": "process_name", "args": {"name": f"{name} ({r.config})"}})
        for g in range(r.num_gpus):
            events.append({"ph": "M", "pid": pid, "tid": g, "name": "thread_name", "args": {"name": f"GPU {g}"}})
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


def write_trace(results: dict[str, SimResult], path: str | Path) -> None:
    """Write a trace that chrome://tracing and ui.perfetto.dev open."""
    Path(path).write_text(json.dumps({"traceEvents": trace_events(results), "displayTimeUnit": "ms"}))
