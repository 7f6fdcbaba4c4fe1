"""``jigsaw-verl``: the command line.

- ``jigsaw-verl simulate WORKLOAD.yaml [--policies a,b] [--json F] [--trace F] [--plot F]``
- ``jigsaw-verl demo [--out DIR] [--skip-recipe]``: the simulator on the bundled long-CoT workload (table, trace,
  plot), then verl's own trainer running the tiny GRPO recipe on the CPU backend.

Bad input (a workload file, a policy name, an output path) gets one line on stderr and exit code 2, before any
simulation starts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

DEMO_WORKLOAD = "longcot-qwen3-4b-x2-8xh100.yaml"


class UsageError(Exception):
    """A user mistake; reported as one line, exit code 2."""


def _writable(path: str | None, what: str) -> Path | None:
    if path is None:
        return None
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"{what} {path}: is a directory, expected a file path")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(p, "a"):
            pass
    except OSError as err:
        raise UsageError(f"{what} {path}: cannot write: {err.strerror or err}") from None
    return p


def _progress(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


def cmd_simulate(args: argparse.Namespace) -> int:
    from .core.spec import SpecError
    from .sim.runner import DEFAULT_POLICIES, Runner, check_policy_names
    from .sim.workload_file import load_workload

    names = [n.strip() for n in args.policies.split(",") if n.strip()] if args.policies else DEFAULT_POLICIES
    try:
        workload = load_workload(args.workload)
        check_policy_names(names)
    except SpecError as err:
        raise UsageError(str(err)) from None
    except (KeyError, ValueError) as err:
        raise UsageError(f"--policies: {err.args[0]}") from None
    json_path = _writable(args.json, "--json")
    trace_path = _writable(args.trace, "--trace")
    plot_path = _writable(args.plot, "--plot")

    from .sim.table import format_report

    started = time.perf_counter()
    report = Runner(workload, progress=_progress).report(names)
    print(format_report(report))
    if json_path:
        json_path.write_text(json.dumps(report.to_json(), indent=2) + "\n")
        _progress(f"wrote {json_path}")
    if trace_path:
        from .sim.trace import write_trace

        write_trace(report.results, trace_path)
        _progress(f"wrote {trace_path} (open in ui.perfetto.dev)")
    if plot_path:
        from .sim.plot import write_plot

        write_plot(report.results, plot_path, title=workload.name)
        _progress(f"wrote {plot_path}")
    _progress(f"done in {time.perf_counter() - started:.1f} s")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from .sim.workload_file import BUNDLED_DIR

    out = Path(args.out)
    _progress(f"demo 1/2: simulating {DEMO_WORKLOAD} with every baseline; outputs in {out}/")
    ns = argparse.Namespace(
        workload=str(BUNDLED_DIR / DEMO_WORKLOAD),
        policies=None,
        json=str(out / "demo.json"),
        trace=str(out / "demo.trace.json"),
        plot=str(out / "demo.png"),
    )
    rc = cmd_simulate(ns)
    if rc or args.skip_recipe:
        return rc
    import subprocess

    recipe = Path(__file__).resolve().parent.parent / "recipes" / "cpu_tiny_grpo.sh"
    _progress(f"demo 2/2: {recipe.name}: verl's trainer, 3 GRPO steps of a tiny model on the CPU (about 3 min)")
    env = dict(os.environ, OUT=str(out / "cpu_tiny_grpo"), PY=sys.executable)
    started = time.perf_counter()
    rc = subprocess.run(["bash", str(recipe)], env=env).returncode
    _progress(
        f"demo 2/2: recipe {'finished' if rc == 0 else f'failed (exit {rc})'} in {time.perf_counter() - started:.0f} s"
    )
    return rc


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jigsaw-verl", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sim = sub.add_parser("simulate", help="simulate policies on a workload file and compare them")
    sim.add_argument("workload", help="workload YAML (format: jigsaw_verl/workloads/FORMAT.md)")
    sim.add_argument("--policies", help="comma-separated policy names (default: every baseline)")
    sim.add_argument("--json", help="write the results as JSON here")
    sim.add_argument("--trace", help="write a Chrome/Perfetto trace here")
    sim.add_argument("--plot", help="write a utilisation plot (PNG) here")
    sim.set_defaults(func=cmd_simulate)
    demo = sub.add_parser("demo", help="the main job on an embedded default (the simulator for now)")
    demo.add_argument("--out", default="out", help="folder for the demo's JSON, trace and plot (default: out)")
    demo.add_argument("--skip-recipe", action="store_true", help="only the simulation, not the CPU GRPO recipe")
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except UsageError as err:
        print(f"jigsaw-verl: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
