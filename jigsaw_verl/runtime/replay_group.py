"""The predicted run of a live group: its ``group.json`` replayed (:mod:`.live_replay`) with the stage times of
baseline runs in which each pipeline ran alone on a home of its width.

``predict_group(folder, baselines)``: ``folder`` is a ``jigsaw-verl mux`` output folder (what the group's pipelines
joined with, when, and where they lived: ``group.json``); ``baselines`` maps a home width (slots) to the output
folder of a run of the same pipelines alone on homes of that width (``verl-seq`` for the whole pool, ``verl-split``
for a slice). The replay's leases read back as a :class:`~jigsaw_verl.report.live_run.LiveRun`, like a live run's.
"""

from __future__ import annotations

import json
from pathlib import Path

from jigsaw_verl.model.engine_memory import EngineReservation
from jigsaw_verl.model.spec_record import gpu_from_record, pipeline_from_record
from jigsaw_verl.model.topology import PoolTopology
from jigsaw_verl.report.live_run import LiveRun, live_run_of
from jigsaw_verl.report.live_stage_times import AloneTimes, alone_times
from jigsaw_verl.runtime.live_replay import LiveReplay, ReplayPipeline


def replay_pipelines(group: dict, times: dict[int, dict[str, AloneTimes]], source: str) -> list[ReplayPipeline]:
    """The pipelines of ``group`` (``group.json``), each with its alone times on its width (``ValueError`` naming
    ``source`` when no baseline has that width or that pipeline)."""
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
            )
        )
    return pipes


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
    times = {int(w): alone_times(f) for w, f in baselines.items()}
    pipes = replay_pipelines(group, times, str(path))
    topology = PoolTopology(int(group["num_slots"]), int(group["slots_per_node"]))
    replay = LiveReplay(pipes, topology, gpu_from_record(group["slot"]), str(group["policy"]))
    result = replay.run()
    return live_run_of(result.leases, topology.num_slots, {}, group_size=group_size, batch_prompts=batch_prompts)
