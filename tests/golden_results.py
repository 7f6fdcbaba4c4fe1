"""The golden record of every policy on every bundled workload (used by ``test_golden_results_on_cpu.py``).

Each (workload, policy) pair is run as ``jigsaw-verl simulate`` runs it (the runner's best configuration) and
reduced to figures a reader can compare (makespan, finish times, counts) plus a SHA-256 of each full result
field (every slice, stage, migration, token count), so any change of any simulated figure is caught while the
file stays small. Regenerate only for a deliberate behaviour change, in its own commit saying why:

    .venv/bin/python tests/golden_results.py --write
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

from jigsaw_verl.model.workload_file import bundled_workloads, load_workload
from jigsaw_verl.policy.registry import POLICIES
from jigsaw_verl.sim.runner import Runner

GOLDEN = Path(__file__).resolve().parent / "golden" / "sim_results.json"


def _digest(obj) -> str:
    return hashlib.sha256(repr(obj).encode()).hexdigest()


def record(result) -> dict:
    """The golden entry of one :class:`SimResult`."""
    return {
        "config": result.config,
        "makespan_s": repr(result.makespan_s),
        "finish_s": {p: repr(t) for p, t in sorted(result.finish_s.items())},
        "slices": len(result.slices),
        "stages": len(result.stages),
        "migrations": len(result.migrations),
        "reprefill_tokens": result.reprefill_tokens,
        "generated_tokens": {p: int(sum(int(a.sum()) for a in v)) for p, v in sorted(result.generated.items())},
        "staleness": dict(sorted(result.staleness.items())),
        "sha256": {
            "slices": _digest(result.slices),
            "stages": _digest(result.stages),
            "migrations": _digest(result.migrations),
            "tokens": _digest({p: [a.tolist() for a in v] for p, v in sorted(result.generated.items())})
            + _digest({p: [a.tolist() for a in v] for p, v in sorted(result.completions.items())}),
            "finish_offsets": _digest(sorted(result.rollout_finish_offsets.items())),
        },
    }


def run_all() -> dict:
    """``{workload name: (workload, {policy: result})}`` for every bundled workload and registered policy."""
    out = {}
    for path in bundled_workloads():
        workload = load_workload(path)
        runner = Runner(workload)
        names = [n for n in POLICIES.names() if n not in runner.infeasible(POLICIES.names())]
        out[workload.name] = (workload, {name: runner.run_policy(name) for name in names})
    return out


def compute(runs: dict | None = None) -> dict:
    """The golden record of :func:`run_all`'s results."""
    runs = runs if runs is not None else run_all()
    return {
        w: {name: record(results[name]) if name in results else "infeasible" for name in POLICIES.names()}
        for w, (_, results) in runs.items()
    }


def check_and_record(path: str) -> tuple[str, dict, list[str]]:
    """Every policy on the workload file ``path``: its name, each policy's golden entry, and the schedule checks'
    failures (``policy: message``); what a worker process of :func:`checked_records` runs."""
    from schedule_checks import check_all

    workload = load_workload(path)
    runner = Runner(workload)
    records, failures = {}, []
    infeasible = runner.infeasible(POLICIES.names())
    for name in POLICIES.names():
        if name in infeasible:  # no configuration fits the pool (a disaggregated baseline on 4 GPUs at TP 4)
            records[name] = "infeasible"
            continue
        result = runner.run_policy(name)
        records[name] = record(result)
        try:
            check_all(workload, result)
        except AssertionError as err:
            failures.append(f"{workload.name} / {name}: {err}")
    return workload.name, records, failures


def checked_records(workers: int | None = None) -> tuple[dict, list[str]]:
    """:func:`check_and_record` of every bundled workload, one workload per task over ``workers`` processes
    (fresh interpreters: the simulator is pure, so each gives what one process would)."""
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor

    paths = [str(p) for p in bundled_workloads()]
    workers = workers or min(len(paths), os.cpu_count() or 1)
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_worker_path) as pool:
        done = list(pool.map(check_and_record, paths))
    return {name: records for name, records, _ in done}, [f for _, _, fails in done for f in fails]


def _worker_path() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # schedule_checks lives beside this file


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write {GOLDEN.name}")
    args = parser.parse_args()
    data = compute()
    if args.write:
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    json.dump(data, sys.stdout, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
