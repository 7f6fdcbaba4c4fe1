"""The predicted run of a live group: its ``group.json`` replayed (:mod:`.live_replay`) with the stage times of
baseline runs in which each pipeline ran alone on a home of its width.

``predict_group(folder, baselines)``: ``folder`` is a ``jigsaw-verl mux`` output folder (what the group's pipelines
joined with, when, and where they lived: ``group.json``); ``baselines`` maps a home width (slots) to the output
folder of a run of the same pipelines alone on homes of that width (``verl-seq`` for the whole pool, ``verl-split``
for a slice). Each pipeline's start-up is the run's own (``requested_s`` in ``group.json``, its start-up lease in
``leases.json``), so what is predicted is the steady state. The replay's leases read back as a
:class:`~jigsaw_verl.report.live_run.LiveRun`, like a live run's.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from jigsaw_verl.model.engine_memory import EngineReservation
from jigsaw_verl.model.graph import INIT, WEIGHT_SYNC
from jigsaw_verl.model.spec_record import gpu_from_record, pipeline_from_record
from jigsaw_verl.model.topology import PoolTopology
from jigsaw_verl.report.live_run import LiveRun, live_run_of
from jigsaw_verl.report.live_stage_times import AloneTimes, alone_times, merged_leases
from jigsaw_verl.runtime.live_replay import LiveReplay, ReplayPipeline


def start_ups(group: dict, leases: list[dict]) -> dict[str, tuple[float, float]]:
    """Per pipeline of a run, its start-up lease's seconds and the trainer's work from its end to the first sync's
    request (``group.json``'s ``requested_s``, ``leases.json``); pipelines without those records are left out."""
    inits = {s["pipeline"]: s for s in merged_leases(leases) if s["stage"] == INIT and int(s["step"]) < 0}
    found = {}
    for record in group["pipelines"]:
        name = record["spec"]["name"]
        asked = record.get("requested_s", {}).get(WEIGHT_SYNC)
        if name in inits and asked is not None:
            init = inits[name]
            found[name] = (init["end_s"] - init["start_s"], max(0.0, asked - init["end_s"]))
    return found


def replay_pipelines(
    group: dict,
    times: dict[int, dict[str, AloneTimes]],
    source: str,
    start_up: dict[str, tuple[float, float]] | None = None,
) -> list[ReplayPipeline]:
    """The pipelines of ``group`` (``group.json``), each with its alone times on its width and its own ``start_up``
    where given (``ValueError`` naming ``source`` when no baseline has that width or that pipeline)."""
    pipes = []
    for record in group["pipelines"]:
        spec = pipeline_from_record(record["spec"])
        width = int(record["slots"])
        if width not in times or spec.name not in times[width]:
            have = {w: sorted(t) for w, t in times.items()}
            raise ValueError(f"{source}: no baseline run of {spec.name!r} alone on {width} slot(s) (have {have})")
        engine = record.get("engine")
        pipes.append(
            ReplayPipeline(
                spec=spec,
                slots=width,
                times=times[width][spec.name],
                joined_s=float(record["joined_s"]),
                offload=bool(record["offload"]),
                engine=None if engine is None else EngineReservation(**engine),
                home=tuple(record["home"]),
                start_up=(start_up or {}).get(spec.name),
            )
        )
    return pipes


def same_start_up_gap(times: dict[int, dict[str, AloneTimes]]) -> dict[int, dict[str, AloneTimes]]:
    """Every pipeline's gap from start-up to its first sync request: the shortest of all baselines' (the trainer's
    own work there does not depend on the home; a baseline's gap also holds the wait for another pipeline's
    start-up or turn, and ``verl-split``'s pipelines, on homes of their own, wait for nobody)."""
    gap = min((t.gaps[INIT] for by_name in times.values() for t in by_name.values() if INIT in t.gaps), default=0.0)
    return {w: {n: replace(t, gaps={**t.gaps, INIT: gap}) for n, t in by_name.items()} for w, by_name in times.items()}


def predict_group(
    folder: str | Path, baselines: dict[int, str | Path], *, group_size: int, batch_prompts: int
) -> LiveRun:
    """The replayed run of the group whose files are in ``folder``, from the ``baselines``' stage times; its
    pipelines' response lengths are the baselines' (the same prompts and seeds)."""
    folder = Path(folder)
    path = folder / "group.json"
    if not path.is_file():
        raise ValueError(f"{path}: missing (written by jigsaw-verl mux at the end of a run)")
    group = json.loads(path.read_text())
    times = same_start_up_gap({int(w): alone_times(f) for w, f in baselines.items()})
    leases = json.loads((folder / "leases.json").read_text())
    pipes = replay_pipelines(group, times, str(path), start_ups(group, leases))
    topology = PoolTopology(int(group["num_slots"]), int(group["slots_per_node"]))
    replay = LiveReplay(pipes, topology, gpu_from_record(group["slot"]), str(group["policy"]))
    result = replay.run()
    return live_run_of(result.leases, topology.num_slots, {}, group_size=group_size, batch_prompts=batch_prompts)
