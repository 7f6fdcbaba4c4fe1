"""Run verl recipes as written: their ``python3 -m verl.trainer.main_ppo`` becomes the plugin's entry point.

verl's example scripts call verl's own entry point (``python3 -m verl.trainer.main_ppo ... "$@"``, or the same
through ``uv run``), which refuses the ``jigsaw`` group (``Key 'jigsaw' is not in struct``). The launcher and
``jigsaw-verl check`` run a recipe with a folder of shims first on its ``PATH``: ``python``, ``python3`` (and
``uv`` where it is installed) that swap the words ``-m verl.trainer.main_ppo`` for ``-m jigsaw_verl.main_ppo``
(verl's entry point plus the ``jigsaw`` group, every verl override unchanged) and run everything else unchanged.
``python``/``python3`` run the launcher's own interpreter (where jigsaw-verl and verl are installed); ``uv`` the
one the recipe would have found. A recipe that names an interpreter by its full path, or runs another entry point,
is not redirected: :func:`check_recipes` finds that out before Ray (the entry point never reported) and says so.

In check mode (``JIGSAW_VERL_CHECK`` names a file) the plugin's entry point runs every check it runs before Ray,
writes its verdict and the planning spec to that file, and exits without starting anything.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from jigsaw_verl.model.catalogue import GPUSpec
from jigsaw_verl.model.engine_memory import EngineReservation
from jigsaw_verl.model.spec import ClusterSpec, WorkloadSpec
from jigsaw_verl.model.spec_record import pipeline_from_record
from jigsaw_verl.model.topology import PoolTopology
from jigsaw_verl.pool.homes import group_homes, group_memory_refusal
from jigsaw_verl.runtime.leases import PolicyRefused
from jigsaw_verl.runtime.live_policy import live_policy_factory

# the entry point's check mode: a path it writes its verdict to (and then exits, before Ray)
CHECK_ENV = "JIGSAW_VERL_CHECK"
VERL_ENTRY, PLUGIN_ENTRY = "verl.trainer.main_ppo", "jigsaw_verl.main_ppo"
# seconds a recipe's check may take (its shell script, hydra's composition of verl's config, the checks)
CHECK_TIMEOUT_S = 180

SHIM = """#!/usr/bin/env bash
# jigsaw-verl: `-m {verl}` runs as `-m {plugin}` (verl's entry point plus the jigsaw group); all else unchanged.
args=("$@")
for ((i = 0; i + 1 < ${{#args[@]}}; i++)); do
    if [ "${{args[i]}}" = "-m" ] && [ "${{args[i + 1]}}" = "{verl}" ]; then
        args[i + 1]={plugin}
        break
    fi
done
exec {real} "${{args[@]}}"
"""


def group_overrides(
    group: str,
    policy: str,
    *,
    pool_slots: int | None = None,
    pool_nodes: int | None = None,
    max_pipelines: int | None = None,
    pin_cores: bool = False,
) -> list[str]:
    """The ``jigsaw.*`` overrides that make a recipe a pipeline of ``group`` (what the launcher appends to each
    recipe, and what ``jigsaw-verl check`` checks a recipe with); ``pin_cores``: its slots' own cores only (CPU)."""
    args = ["jigsaw.enable=true", f"jigsaw.mux.group={group}", f"jigsaw.mux.policy={policy}"]
    if pool_slots is not None:
        args.append(f"jigsaw.mux.pool_slots={pool_slots}")
    if pool_nodes is not None:
        args.append(f"jigsaw.mux.pool_nodes={pool_nodes}")
    if max_pipelines is not None:
        args.append(f"jigsaw.mux.max_pipelines={max_pipelines}")
    if pin_cores:
        args.append("jigsaw.mux.pin_cores=true")
    return args


def write_shims(folder: Path, path: str | None = None) -> Path:
    """Write the entry-point shims into ``folder`` (``python``, ``python3``, and ``uv`` if ``path`` has one)."""
    folder.mkdir(parents=True, exist_ok=True)
    reals = {"python": sys.executable, "python3": sys.executable}
    uv = shutil.which("uv", path=path if path is not None else os.environ.get("PATH", ""))
    if uv:
        reals["uv"] = uv
    for name, real in reals.items():
        shim = folder / name
        shim.write_text(SHIM.format(verl=VERL_ENTRY, plugin=PLUGIN_ENTRY, real=shlex.quote(real)))
        shim.chmod(0o755)
    return folder


def recipe_env(shims: Path, base: dict[str, str] | None = None, **extra: str) -> dict[str, str]:
    """The environment a recipe runs in: the shims first on ``PATH``, ``PY`` the launcher's interpreter."""
    env = dict(os.environ if base is None else base)
    env["PATH"] = f"{shims}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("PY", sys.executable)
    env.update(extra)
    return env


@dataclass(frozen=True, kw_only=True)
class RecipeCheck:
    """What the entry point's check mode said of one recipe.

    Attributes:
        recipe: the recipe as given (``path.sh [override ...]``).
        problems: one line per problem (empty: it can join a group).
        spec: the planning spec the scheduler would see (``PipelineSpec`` fields), when there is no problem.
        steps_how: where its step count came from.
        engine: what its rollout engine reserves and it pins per slot (``EngineReservation`` fields).
        slot_memory_bytes: the slot memory its group would plan with.
    """

    recipe: str
    problems: tuple[str, ...]
    spec: dict | None = None
    steps_how: str = ""
    engine: dict | None = None
    slot_memory_bytes: float | None = None

    @property
    def ok(self) -> bool:
        return not self.problems


def group_memory_problem(checks: list[RecipeCheck], topology: PoolTopology) -> str | None:
    """The placement and slot memory rules over a group of checked recipes (placed in order, as the launcher starts
    them, by the executor's home rule on the pool's nodes) on the slot memory the first one (the group's creator)
    plans with; ``None``: it fits."""
    reservations = [EngineReservation(**c.engine) for c in checks]
    tps = [int(c.spec["rollout_tp"]) for c in checks]
    return group_memory_refusal(reservations, tps, topology, checks[0].slot_memory_bytes)


def group_plan_homes(checks: list[RecipeCheck], topology: PoolTopology) -> dict[str, tuple[int, ...]]:
    """Each checked recipe's home (by its pipeline name), placed in order by the pool rule: what the launcher
    reserves with the group's scheduler, so the pipelines live where the group check placed them whatever order
    they join in."""
    reservations = [EngineReservation(**c.engine) for c in checks]
    homes = group_homes(reservations, [int(c.spec["rollout_tp"]) for c in checks], topology)
    return {r.pipeline: home for r, home in zip(reservations, homes, strict=True) if home is not None}


def check_recipes(recipes: list[list[str]], appended: list[list[str]], *, progress=None) -> list[RecipeCheck]:
    """Run each recipe (``[path, override ...]``) with its ``appended`` overrides in the entry point's check mode,
    all at once; nothing starts Ray. Each is given its own ``jigsaw`` overrides after the recipe's."""
    with tempfile.TemporaryDirectory(prefix="jigsaw-check-") as tmp:
        shims = write_shims(Path(tmp) / "bin")
        procs = []
        for i, (recipe, extra) in enumerate(zip(recipes, appended, strict=True)):
            verdict, log = Path(tmp) / f"{i}.json", Path(tmp) / f"{i}.log"
            env = recipe_env(shims, **{CHECK_ENV: str(verdict)}, OUT=str(Path(tmp) / f"out{i}"))
            with log.open("w") as fh:
                proc = subprocess.Popen(
                    ["bash", recipe[0], *extra, *recipe[1:]],
                    env=env,
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            procs.append((recipe, proc, verdict, log))
        try:
            return [_verdict(*p) for p in procs]
        finally:
            stop_sessions([proc for _, proc, _, _ in procs])


def _verdict(recipe: list[str], proc: subprocess.Popen, verdict: Path, log: Path) -> RecipeCheck:
    given = shlex.join(recipe)
    try:
        rc = proc.wait(timeout=CHECK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return RecipeCheck(recipe=given, problems=(f"its check did not finish in {CHECK_TIMEOUT_S} s",))
    tail = " | ".join(line.strip() for line in log.read_text().splitlines()[-3:] if line.strip())
    data = json.loads(verdict.read_text()) if verdict.is_file() else None
    if data is not None and data.get("composing"):  # the entry point's placeholder: hydra stopped before checking
        return RecipeCheck(recipe=given, problems=(f"hydra could not compose its config (exit {rc}): {tail}",))
    if data is not None:
        return RecipeCheck(
            recipe=given,
            problems=tuple(data["problems"]),
            spec=data.get("spec"),
            steps_how=data["how"],
            engine=data.get("engine"),
            slot_memory_bytes=data.get("slot_memory_bytes"),
        )
    why = f"it exited {rc} first: {tail}" if rc else "it exited 0 without calling it"
    return RecipeCheck(
        recipe=given,
        problems=(
            f"the recipe never reached {PLUGIN_ENTRY} ({why}); the launcher runs recipes that call "
            f"`python3 -m {VERL_ENTRY}` or `-m {PLUGIN_ENTRY}` through python, python3 or uv on their PATH",
        ),
    )


def stop_sessions(procs: list[subprocess.Popen], grace_s: float = 5.0) -> None:
    """Stop each process's whole session (each was started as its leader): SIGTERM to all, then SIGKILL to what
    is left after ``grace_s``."""
    import signal

    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc in procs:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if all(p.poll() is not None and not _session_alive(p.pid) for p in procs):
                return
            time.sleep(0.1)


def _session_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def group_policy_problem(
    checks: list[RecipeCheck], topology: PoolTopology, slot: GPUSpec, policy: str, homes: dict[str, tuple[int, ...]]
) -> str | None:
    """Whether the group's policy has a plan for all its pipelines, built as the live executor will build it once
    they have joined (in pool order, on the slot memory the group plans with): a policy with no configuration for
    them (``verl-split`` where a pipeline's training state does not fit its slice) is one line here, before Ray,
    not a refusal when the last one joins. ``None``: it has."""
    specs = [pipeline_from_record(c.spec) for c in checks]
    order = sorted(range(len(specs)), key=lambda i: (homes.get(specs[i].name, ()), i))
    cluster = ClusterSpec(gpu=slot, num_gpus=topology.num_slots, gpus_per_node=topology.slots_per_node)
    workload = WorkloadSpec(name="live", seed=0, cluster=cluster, pipelines=tuple(specs[i] for i in order))
    try:
        live_policy_factory(policy)(workload)
    except PolicyRefused as err:
        return str(err)
    except ValueError as err:  # the policy's cost model cannot place them (a model whose KV does not fit, ...)
        return f"jigsaw.mux.policy={policy!r} cannot plan these pipelines on {slot.name} slots: {err}"
    return None
