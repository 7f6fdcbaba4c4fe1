"""``jigsaw-verl mux RECIPE.sh RECIPE.sh ...``: run several verl recipes as one multiplexing group.

A recipe is a shell script as verl's examples are (``python3 -m verl.trainer.main_ppo ... "$@"``) or one that calls
``jigsaw_verl.main_ppo`` itself; it runs unmodified, with the entry-point shims of :mod:`.recipe_entry` first on its
``PATH``, and may be given with its own overrides (``"recipes/cpu_tiny_grpo.sh actor_rollout_ref.rollout.seed=11"``).
Before Ray starts, every recipe runs in the entry point's check mode with what the launcher will append
(``jigsaw.enable=true``, ``jigsaw.mux.group``, its own ``jigsaw.mux.pipeline`` / ``trainer.experiment_name``): every
problem of every recipe is one line and nothing starts. Then the launcher starts a local Ray cluster, or joins the
one ``RAY_ADDRESS`` names (on a GPU cluster), creates the group's scheduler actor and starts each recipe in a
session of its own, its driver joining the cluster through ``RAY_ADDRESS``. While they run it prints a progress bar
per pipeline (steps done, the stage it holds or waits for); at the end it writes a combined Perfetto trace and a
utilisation plot of the leases (``mux.trace.json``, ``mux.png``, the raw leases in ``leases.json``), where every
pipeline's workers were placed (``pool.json``: all in the pool's one placement group, which the scheduler owns),
the stage times its predictor learned from (``stage_times.json``), what each pipeline joined with (``group.json``:
planning spec, slots, engine; what :mod:`.live_replay` replays) and, on the CPU backend, the device-memory
ledger's timeline (``memory.json``, also a memory track per slot in the trace), beside each pipeline's log and metrics
(``<pipeline>.log``, ``<pipeline>.metrics.jsonl``). A pipeline that fails does not stop the others; the
launcher's exit code is the first non-zero one. Ctrl-C (SIGINT) or SIGTERM stops every pipeline's session, the
group's scheduler and the Ray cluster the launcher started, and exits 130.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from jigsaw_verl.model.slots import slot_spec
from jigsaw_verl.model.topology import PoolTopology
from jigsaw_verl.pool.timeline import Slice, Timeline
from jigsaw_verl.runtime.leases import PolicyRefused
from jigsaw_verl.runtime.live_policy import live_policy_factory
from jigsaw_verl.runtime.recipe_entry import (
    check_recipes,
    group_memory_problem,
    group_overrides,
    group_plan_homes,
    group_policy_problem,
    recipe_env,
    stop_sessions,
    write_shims,
)

# longest the launcher waits for one status answer of the group's scheduler before it looks at Ctrl-C again
STATUS_TIMEOUT_S = 2.0
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


class RecipeRefused(ValueError):
    """Recipes the group cannot run, found before Ray: one line per problem, naming the recipe and the key."""

    def __init__(self, lines: list[str]):
        super().__init__("\n".join(lines))
        self.lines = lines


def launch(
    recipes: list[str],
    *,
    group: str = "mux",
    pool_slots: int = 2,
    pool_nodes: int = 1,
    policy: str,
    device: str = "cpu",
    gpu: str | None = None,
    out: str = "out/mux",
    pin_cores: bool = False,
    progress=print,
) -> dict:
    """Run ``recipes`` as one group (each ``"path.sh [override ...]"``); Ctrl-C (SIGINT) or SIGTERM stops every
    pipeline, the group's scheduler and the Ray cluster this started.

    Returns:
        ``{"rc", "wall_s", "pipelines": {name: exit code}, "trace", "plot", "interrupted"}``.

    Raises:
        RecipeRefused: a recipe the group cannot run (every pre-Ray check of each, before Ray starts).
    """
    parsed = _parse_recipes(recipes)
    topology = _pool_topology(pool_slots, pool_nodes)
    try:
        live_policy_factory(policy)  # unknown, or needs asynchronous execution: one line before Ray starts
    except PolicyRefused as err:
        raise ValueError(f"--policy: {err}") from None
    slot = slot_spec(device, gpu)
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    names = [f"p{i}-{Path(p[0]).stem}" for i, p in enumerate(parsed)]
    group_args = group_overrides(
        group, policy, pool_slots=pool_slots, pool_nodes=pool_nodes, max_pipelines=len(parsed), pin_cores=pin_cores
    )
    appended = [[*group_args, f"jigsaw.mux.pipeline={n}", f"trainer.experiment_name={n}"] for n in names]
    plan = _GroupPlan(names, parsed, appended, group, topology, slot, policy, device, out_dir)
    started = time.perf_counter()
    with _stop_on_signals() as stop:
        # the slot memory the group plans with (its first pipeline's: the one that would create the group)
        memory, homes = _check_group(plan, progress)
        slot = dataclasses.replace(slot, memory_bytes=memory or slot.memory_bytes)
        plan = dataclasses.replace(plan, slot=slot, homes=homes)
        runs, artefacts, interrupted = _run_group(plan, progress, stop)
    wall = time.perf_counter() - started
    rcs = {r.name: r.rc for r in runs}
    if interrupted:
        progress(f"mux: interrupted after {wall:.0f} s; stopped {', '.join(names)}, the group's scheduler and Ray")
        return {"rc": 130, "wall_s": wall, "pipelines": rcs, "trace": None, "plot": None, "interrupted": True}
    trace, placement, history, memory, joined = artefacts
    trace_path, plot_path = out_dir / "mux.trace.json", out_dir / "mux.png"
    (out_dir / "leases.json").write_text(json.dumps(trace, indent=1))
    (out_dir / "pool.json").write_text(json.dumps(placement, indent=1))
    (out_dir / "stage_times.json").write_text(json.dumps(history, indent=1))
    (out_dir / "group.json").write_text(json.dumps(joined, indent=1))
    if memory is not None:
        from jigsaw_verl.pool.ledger import ledger_summary

        (out_dir / "memory.json").write_text(json.dumps(memory, indent=1))
        progress(f"mux: {ledger_summary(memory, trace)}")
    write_live_trace(trace, trace_path, pool_slots, memory)
    write_live_plot(trace, plot_path, pool_slots, title=f"group {group}: {len(runs)} pipelines, policy {policy}")
    progress(f"mux: done in {wall:.0f} s; trace {trace_path}, plot {plot_path}; exit codes {rcs}")
    return {
        "rc": next((rc for rc in rcs.values() if rc), 0),
        "wall_s": wall,
        "pipelines": rcs,
        "trace": str(trace_path),
        "plot": str(plot_path),
        "interrupted": False,
    }


def _pool_topology(pool_slots: int, pool_nodes: int) -> PoolTopology:
    """The pool's shape from ``--pool-slots`` and ``--pool-nodes``; ``ValueError`` (one line) for a shape that cannot
    be cut into equal nodes or cannot be reached (several nodes, but no cluster to join)."""
    if pool_nodes < 1 or pool_slots < 1 or pool_slots % pool_nodes:
        raise ValueError(
            f"--pool-nodes {pool_nodes}: the pool's {pool_slots} slots must cut into that many equal nodes"
        )
    if pool_nodes > 1 and not os.environ.get("RAY_ADDRESS"):
        raise ValueError(
            f"--pool-nodes {pool_nodes}: without RAY_ADDRESS the launcher starts Ray on this one machine; start Ray on "
            "each node (`ray start --head`, then `ray start --address=...`) and set RAY_ADDRESS to the head"
        )
    return PoolTopology.of_nodes(pool_nodes, pool_slots // pool_nodes)


@dataclass(frozen=True)
class _GroupPlan:
    names: list[str]
    recipes: list[list[str]]  # [path, override ...] as given
    appended: list[list[str]]  # what the launcher appends to each (its jigsaw.* keys and experiment name)
    group: str
    topology: PoolTopology
    slot: object  # the slot's GPUSpec
    policy: str
    device: str
    out_dir: Path
    # each pipeline's home, placed by the pool rule in the launcher's order (the group check's placement)
    homes: dict = dataclasses.field(default_factory=dict)


def _check_group(plan: _GroupPlan, progress) -> tuple[float, dict[str, tuple[int, ...]]]:
    """Every recipe through the entry point's check mode (all at once, no Ray); refuse the group on a problem.
    Returns the slot memory the group plans with, bytes, and each pipeline's home in the pool."""
    progress(f"mux: checking {len(plan.recipes)} recipes (every pre-Ray check of the entry point, no Ray yet)")
    checks = check_recipes(plan.recipes, plan.appended)
    problems = [f"{n} ({c.recipe}): {line}" for n, c in zip(plan.names, checks, strict=True) for line in c.problems]
    if problems:
        raise RecipeRefused(problems)
    memory = group_memory_problem(checks, plan.topology)
    if memory:
        raise RecipeRefused([f"the group's {len(checks)} pipelines: {memory}"])
    for name, c in zip(plan.names, checks, strict=True):
        spec = c.spec
        progress(
            f"mux: {name}: {spec['model']['name']}, {spec['batch_prompts']} prompts x {spec['group_size']}, "
            f"{spec['steps']} steps ({c.steps_how})"
        )
    homes = group_plan_homes(checks, plan.topology)
    slot = dataclasses.replace(plan.slot, memory_bytes=checks[0].slot_memory_bytes or plan.slot.memory_bytes)
    unplanned = group_policy_problem(checks, plan.topology, slot, plan.policy, homes)
    if unplanned:
        raise RecipeRefused([f"the group's {len(checks)} pipelines: {unplanned}"])
    return checks[0].slot_memory_bytes, homes


def _run_group(plan: _GroupPlan, progress, stop: threading.Event) -> tuple[list[_Run], tuple | None, bool]:
    """Start Ray, the group's scheduler and every pipeline; wait for them (until ``stop``: Ctrl-C or SIGTERM).
    Returns ``(runs, (trace, placement, history, memory, group) or None, interrupted)``."""
    import ray

    from jigsaw_verl.runtime.scheduler import NAMESPACE, actor_name, get_scheduler

    runs: list[_Run] = []
    interrupted = False
    _start_ray(plan.device, len(plan.recipes))
    try:
        address = ray.get_runtime_context().gcs_address
        # the pool holds every recipe's workers at once (each takes 1/(3 x len(recipes)) of a slot)
        scheduler = get_scheduler(
            plan.group, plan.topology.num_slots, plan.slot, plan.policy, len(plan.recipes), plan.topology.nodes
        )
        # the pool first: its placement groups take their nodes before any pipeline's other actors can
        try:
            ray.get(scheduler.reserve.remote(DEVICE_RESOURCES[plan.device], plan.homes))
        except ray.exceptions.RayTaskError as err:  # too few nodes, or no room on them: one line, nothing started
            raise ValueError(
                f"--pool-slots {plan.topology.num_slots} --pool-nodes {plan.topology.nodes}: {err.cause}"
            ) from None
        shims = write_shims(plan.out_dir / "bin")
        for name, recipe, extra in zip(plan.names, plan.recipes, plan.appended, strict=True):
            runs.append(_start_pipeline(name, recipe, extra, shims, address, plan.out_dir, progress))
        _watch(runs, scheduler, progress, stop)
        methods = ("trace", "placement", "history", "memory", "group")
        artefacts = tuple(ray.get(getattr(scheduler, m).remote()) for m in methods)
    except KeyboardInterrupt:
        interrupted, artefacts = True, None
        progress("mux: interrupted; stopping every pipeline, the group's scheduler and Ray")
    finally:
        stop_sessions([run.proc for run in runs])
        for run in runs:
            run.rc = run.proc.poll() if run.rc is None else run.rc
            run.log.close()
        try:
            ray.kill(ray.get_actor(actor_name(plan.group), namespace=NAMESPACE))
        except Exception:  # noqa: BLE001 - not created, or gone already: nothing to stop
            pass
        ray.shutdown()
    return runs, artefacts, interrupted


@contextlib.contextmanager
def _stop_on_signals():
    """Ctrl-C (SIGINT) and SIGTERM stop the group: each raises KeyboardInterrupt in the launcher and is remembered in
    the event this yields, so the watch loop stops at its next turn even where the exception was lost in a call."""
    stop = threading.Event()

    def interrupt(signum, frame):
        stop.set()
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _parse_recipes(recipes: list[str]) -> list[list[str]]:
    """Each ``"path.sh [override ...]"`` split into words; the script must exist."""
    import shlex

    parsed = [shlex.split(r) for r in recipes]
    if any(not p for p in parsed):
        raise ValueError("an empty recipe was given")
    missing = [p[0] for p in parsed if not Path(p[0]).is_file()]
    if missing:
        raise FileNotFoundError(f"recipe not found: {', '.join(missing)}")
    return parsed


# the Ray resource of a pool slot per --device (verl's device name -> its Ray resource name)
DEVICE_RESOURCES = {"cpu": "CPU", "cuda": "GPU"}


def _start_ray(device: str, pipelines: int) -> None:
    import ray

    if os.environ.get("RAY_ADDRESS"):  # a running cluster (a GPU cluster: `ray start` on each node first)
        ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)
    else:  # a local cluster on this machine; the CPU backend's pipelines want logical CPUs to spare
        cpus = CPUS_PER_PIPELINE * pipelines if device == "cpu" else None
        ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=False)


def _start_pipeline(
    name: str, recipe: list[str], extra: list[str], shims: Path, address: str, out_dir: Path, progress
) -> _Run:
    """Start one recipe (``[path, override ...]``) as pipeline ``name`` of the group, in a session of its own (the
    launcher stops it as a whole), with the entry-point shims first on its ``PATH``."""
    path = Path(recipe[0])
    log = out_dir / f"{name}.log"
    env = recipe_env(
        shims,
        RAY_ADDRESS=address,
        OUT=str(out_dir / name),
        VERL_FILE_LOGGER_PATH=str((out_dir / f"{name}.metrics.jsonl").resolve()),
    )
    handle = log.open("w")
    proc = subprocess.Popen(
        ["bash", str(path), *extra, *recipe[1:]],
        env=env,
        stdout=handle,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    progress(f"mux: started {name} ({path}); log {log}")
    return _Run(name, proc, handle)


def _watch(runs: list[_Run], scheduler, progress, stop: threading.Event) -> None:
    """Until every pipeline has exited: poll them and the scheduler, print a line per pipeline when it changes.
    Raises KeyboardInterrupt once ``stop`` is set."""
    import ray

    shown: dict[str, str] = {}
    told: set[str] = set()  # pipelines whose lost node was reported
    while any(r.rc is None for r in runs):
        if stop.is_set():
            raise KeyboardInterrupt
        time.sleep(1.0)
        try:  # bounded, so the loop comes back to ``stop`` however busy the scheduler is
            status = ray.get(scheduler.status.remote(), timeout=STATUS_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            continue
        for r in runs:
            if r.rc is None:
                r.rc = r.proc.poll()
            lost = status["errors"].get(r.name, "")
            if lost.endswith("left the cluster") and r.name not in told:
                told.add(r.name)
                # its workers on the lost node are gone; the rest of it may wait on them in a collective forever
                progress(f"mux: {r.name}: {lost}" + ("; stopping it" if r.rc is None else ""))
                if r.rc is None:
                    stop_sessions([r.proc])
                    r.rc = r.proc.poll()
            info = status["pipelines"].get(r.name)
            if info is not None:
                r.steps, r.done = info["steps"], info["steps_done"]
            elif r.name in status["left_steps"]:
                r.done = status["left_steps"][r.name]
            line = f"mux: {r.name:<24} {_bar(r.done, r.steps)} {_state(r, info, status)}"
            if shown.get(r.name) != line:
                shown[r.name] = line
                progress(line)


def _state(run: _Run, info: dict | None, status: dict) -> str:
    """What a pipeline does now, in a few words, from the scheduler's status."""
    if run.rc is not None:
        return f"exit {run.rc}"
    if run.name in status["errors"]:
        error = status["errors"][run.name]
        return error if error.endswith("left the cluster") else f"refused: {error}"
    if info is None:
        return "left the group" if run.name in status["left"] else "starting"
    if info["running"]:
        return ", ".join(info["running"])
    return f"waiting for {info['waiting']}" if info["waiting"] else "between stages"


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


def write_live_trace(trace: list[dict], path: Path, pool_slots: int, memory: dict | None = None) -> None:
    """The leases as a Chrome/Perfetto trace (a track per slot, a slice per stage), like the simulator's, with the
    ledger's ``memory`` timeline (when there is one) as a counter per slot on the leases' clock."""
    from jigsaw_verl.pool.ledger import memory_track
    from jigsaw_verl.report.trace import write_trace

    t0 = min((float(s["start_s"]) for s in trace), default=0.0)
    counters = [] if memory is None else memory_track(memory, pid=1, t0_s=t0)
    write_trace({"live": live_timeline(trace, pool_slots)}, path, extra_events=counters)


def write_live_plot(trace: list[dict], path: Path, pool_slots: int, *, title: str = "") -> None:
    """Slots leased over time, stacked by pipeline, like the simulator's utilisation plot (nothing when no lease
    was ever granted)."""
    from jigsaw_verl.report.plot import write_plot

    if not trace:
        return
    write_plot({"live": live_timeline(trace, pool_slots)}, path, title=title, ylabel="slots leased")
