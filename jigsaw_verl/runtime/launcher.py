"""``jigsaw-verl mux RECIPE.sh RECIPE.sh ...``: run several verl recipes as one multiplexing group.

The launcher starts a local Ray cluster, or joins the one ``RAY_ADDRESS`` names (on a GPU cluster), and every
pipeline's driver joins that cluster through ``RAY_ADDRESS``; it creates the group's scheduler actor, and starts
each recipe with ``jigsaw.enable=true``, ``jigsaw.mux.group`` and its own ``jigsaw.mux.pipeline`` /
``trainer.experiment_name`` appended (a recipe may be given with its own overrides:
``"recipes/cpu_tiny_grpo.sh actor_rollout_ref.rollout.seed=11"``). While they run it prints a progress bar per
pipeline (steps done, the stage it holds or waits for); at the end it writes a combined Perfetto trace and a
utilisation plot of the leases (``mux.trace.json``, ``mux.png``, the raw leases in ``leases.json``), where every
pipeline's workers were placed (``pool.json``: all in the pool's one placement group, which the scheduler owns)
and the stage times its predictor learned from (``stage_times.json``), beside each pipeline's log and metrics
(``<pipeline>.log``, ``<pipeline>.metrics.jsonl``). A pipeline that fails does not stop the others; the
launcher's exit code is the first non-zero one.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from jigsaw_verl.model.slots import slot_spec
from jigsaw_verl.pool.timeline import Slice, Timeline
from jigsaw_verl.runtime.leases import PolicyRefused
from jigsaw_verl.runtime.live_policy import live_policy_factory

# logical CPUs per CPU pipeline (the CPU backend gives a lone run 16)
CPUS_PER_PIPELINE = 16


@dataclass
class _Run:
    name: str
    proc: subprocess.Popen
    log: IO
    steps: int | None = None
    done: int = 0
    rc: int | None = None


def _bar(done: int, total: int | None, width: int = 20) -> str:
    if not total:
        return f"[{'?' * width}] {done}/?"
    filled = int(width * min(done, total) / total)
    return f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total}"


def launch(
    recipes: list[str],
    *,
    group: str = "mux",
    pool_slots: int = 2,
    policy: str,
    device: str = "cpu",
    gpu: str | None = None,
    out: str = "out/mux",
    progress=print,
) -> dict:
    """Run ``recipes`` as one group (each ``"path.sh [override ...]"``).

    Returns:
        ``{"rc", "wall_s", "pipelines": {name: exit code}, "trace", "plot"}``.
    """
    import shlex

    import ray

    from jigsaw_verl.runtime.scheduler import get_scheduler

    parsed = [shlex.split(r) for r in recipes]
    if any(not p for p in parsed):
        raise ValueError("an empty recipe was given")
    paths = [Path(p[0]) for p in parsed]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"recipe not found: {', '.join(missing)}")
    try:
        live_policy_factory(policy)  # unknown, or needs asynchronous execution: one line before Ray starts
    except PolicyRefused as err:
        raise ValueError(f"--policy: {err}") from None
    slot = slot_spec(device, gpu)
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    if os.environ.get("RAY_ADDRESS"):  # a running cluster (a GPU cluster: `ray start` on each node first)
        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)
    else:  # a local cluster on this machine; the CPU backend's pipelines want logical CPUs to spare
        cpus = CPUS_PER_PIPELINE * len(paths) if device == "cpu" else None
        ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)
    try:
        address = ray.get_runtime_context().gcs_address
        # the pool holds every recipe's workers at once (each takes 1/(3 x len(recipes)) of a slot)
        scheduler = get_scheduler(group, pool_slots, slot, policy, max_pipelines=len(paths))
        runs: list[_Run] = []
        for i, recipe in enumerate(paths):
            name = f"p{i}-{recipe.stem}"
            log = out_dir / f"{name}.log"
            env = dict(
                os.environ,
                RAY_ADDRESS=address,
                OUT=str(out_dir / name),
                PY=sys.executable,
                VERL_FILE_LOGGER_PATH=str((out_dir / f"{name}.metrics.jsonl").resolve()),
            )
            args = [
                "bash",
                str(recipe),
                "jigsaw.enable=true",
                f"jigsaw.mux.group={group}",
                f"jigsaw.mux.pipeline={name}",
                f"jigsaw.mux.pool_slots={pool_slots}",
                f"jigsaw.mux.policy={policy}",
                f"jigsaw.mux.max_pipelines={len(paths)}",
                f"trainer.experiment_name={name}",
                *parsed[i][1:],
            ]
            handle = log.open("w")
            runs.append(_Run(name, subprocess.Popen(args, env=env, stdout=handle, stderr=subprocess.STDOUT), handle))
            progress(f"mux: started {name} ({recipe}); log {log}")
        shown: dict[str, str] = {}
        while any(r.rc is None for r in runs):
            time.sleep(1.0)
            status = ray.get(scheduler.status.remote())
            for r in runs:
                if r.rc is None:
                    r.rc = r.proc.poll()
                    if r.rc is not None:
                        r.log.close()
                info = status["pipelines"].get(r.name)
                if info is not None:
                    r.steps, r.done = info["steps"], info["steps_done"]
                elif r.name in status["left_steps"]:
                    r.done = status["left_steps"][r.name]
                if r.rc is not None:
                    state = f"exit {r.rc}"
                elif r.name in status["errors"]:
                    state = f"refused: {status['errors'][r.name]}"
                elif info is None:
                    state = "left the group" if r.name in status["left"] else "starting"
                elif info["running"]:
                    state = ", ".join(info["running"])
                else:
                    state = f"waiting for {info['waiting']}" if info["waiting"] else "between stages"
                line = f"mux: {r.name:<24} {_bar(r.done, r.steps)} {state}"
                if shown.get(r.name) != line:
                    shown[r.name] = line
                    progress(line)
        trace = ray.get(scheduler.trace.remote())
        placement = ray.get(scheduler.placement.remote())
        history = ray.get(scheduler.history.remote())
        ray.kill(scheduler)
    finally:
        ray.shutdown()
    wall = time.perf_counter() - started
    trace_path, plot_path = out_dir / "mux.trace.json", out_dir / "mux.png"
    (out_dir / "leases.json").write_text(json.dumps(trace, indent=1))
    (out_dir / "pool.json").write_text(json.dumps(placement, indent=1))
    (out_dir / "stage_times.json").write_text(json.dumps(history, indent=1))
    write_live_trace(trace, trace_path, pool_slots)
    write_live_plot(trace, plot_path, pool_slots, title=f"group {group}: {len(runs)} pipelines, policy {policy}")
    rcs = {r.name: r.rc for r in runs}
    progress(f"mux: done in {wall:.0f} s; trace {trace_path}, plot {plot_path}; exit codes {rcs}")
    return {
        "rc": next((rc for rc in rcs.values() if rc), 0),
        "wall_s": wall,
        "pipelines": rcs,
        "trace": str(trace_path),
        "plot": str(plot_path),
    }


def live_timeline(trace: list[dict], pool_slots: int) -> Timeline:
    """The leases (``leases.json`` records) as a timeline from the first lease on (the pipelines' start-up is not
    shown)."""
    t0 = min((float(s["start_s"]) for s in trace), default=0.0)
    fields = {f.name for f in dataclasses.fields(Slice)}
    slices = tuple(
        Slice(
            **{
                **{k: v for k, v in s.items() if k in fields},
                "gpus": tuple(s["gpus"]),
                "sm_shares": tuple(s["sm_shares"]),
                "start_s": float(s["start_s"]) - t0,
                "end_s": float(s["end_s"]) - t0,
            }
        )
        for s in trace
    )
    end = max((s.end_s for s in slices), default=0.0)
    return Timeline(label="live leases", num_slots=pool_slots, end_s=end, slices=slices)


def write_live_trace(trace: list[dict], path: Path, pool_slots: int) -> None:
    """The leases as a Chrome/Perfetto trace (a track per slot, a slice per stage), like the simulator's."""
    from jigsaw_verl.report.trace import write_trace

    write_trace({"live": live_timeline(trace, pool_slots)}, path)


def write_live_plot(trace: list[dict], path: Path, pool_slots: int, *, title: str = "") -> None:
    """Slots leased over time, stacked by pipeline, like the simulator's utilisation plot (nothing when no lease
    was ever granted)."""
    from jigsaw_verl.report.plot import write_plot

    if not trace:
        return
    write_plot({"live": live_timeline(trace, pool_slots)}, path, title=title, ylabel="slots leased")
