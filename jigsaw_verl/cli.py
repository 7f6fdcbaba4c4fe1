"""``jigsaw-verl``: the command line.

- ``jigsaw-verl simulate WORKLOAD.yaml [--policies a,b] [--json F] [--trace F] [--plot F]``
- ``jigsaw-verl mux "RECIPE.sh [override ...]" ... [--group G] [--pool-slots N] [--pool-nodes K] [--policy P]
  [--out DIR] [--pin-cores]``: several verl recipes multiplexed on one pool (:mod:`jigsaw_verl.runtime.launcher`).
- ``jigsaw-verl check RECIPE.sh [override ...]``: every pre-Ray check the entry point runs on a recipe joining a
  group (the ``jigsaw.*`` rules, the model lookup, the step count), and the planning spec; starts nothing.
- ``jigsaw-verl demo [--out DIR] [--skip-recipe]``: the simulator on the bundled long-CoT workload (table, trace,
  plot), then two tiny GRPO pipelines multiplexed live on one pool of 2 CPU slots (``jigsaw-verl mux``: progress
  per pipeline, combined trace and utilisation plot in ``DIR/mux``).

Bad input (a workload file, a policy name, an output path) gets one line on stderr and exit code 2, before any
simulation starts.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

DEMO_WORKLOAD = "longcot-qwen3-4b-x2-8xh100.yaml"
# what the demo's simulation compares beside every baseline: the JigsawRL scheduler without and with look-ahead
DEMO_SCHEDULERS = ("greedy", "jigsaw")


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
    from jigsaw_verl.model.spec import SpecError
    from jigsaw_verl.model.workload_file import load_workload
    from jigsaw_verl.sim.runner import DEFAULT_POLICIES, Runner, check_policy_names

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

    from jigsaw_verl.sim.table import format_report

    started = time.perf_counter()
    runner = Runner(workload, progress=_progress)
    infeasible = runner.infeasible(names)
    if infeasible and args.policies:
        raise UsageError(
            f"--policies: {', '.join(infeasible)} cannot run {args.workload} ({workload.cluster.num_gpus} GPUs, "
            f"{len(workload.pipelines)} pipelines): no configuration of it fits the pool; leave it out or give a "
            f"larger cluster.num_gpus"
        )
    for name in infeasible:
        _progress(f"skipping {name}: no configuration of it fits {workload.cluster.num_gpus} GPUs")
    names = [n for n in names if n not in infeasible]
    report = runner.report(names)
    print(format_report(report))
    timelines = {name: r.timeline() for name, r in report.results.items()}
    if json_path:
        json_path.write_text(json.dumps(report.to_json(), indent=2) + "\n")
        _progress(f"wrote {json_path}")
    if trace_path:
        from jigsaw_verl.report.trace import write_trace

        write_trace(timelines, trace_path)
        _progress(f"wrote {trace_path} (open in ui.perfetto.dev)")
    if plot_path:
        from jigsaw_verl.report.plot import write_plot

        write_plot(timelines, plot_path, title=workload.name)
        _progress(f"wrote {plot_path}")
    _progress(f"done in {time.perf_counter() - started:.1f} s")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from jigsaw_verl.model.workload_file import BUNDLED_DIR
    from jigsaw_verl.policy.registry import BASELINES

    out = Path(args.out)
    _progress(f"demo 1/2: simulating {DEMO_WORKLOAD}: every baseline, greedy and jigsaw; outputs in {out}/")
    ns = argparse.Namespace(
        workload=str(BUNDLED_DIR / DEMO_WORKLOAD),
        policies=",".join((*BASELINES, *DEMO_SCHEDULERS)),
        json=str(out / "demo.json"),
        trace=str(out / "demo.trace.json"),
        plot=str(out / "demo.png"),
    )
    rc = cmd_simulate(ns)
    if rc or args.skip_recipe:
        return rc
    from jigsaw_verl.runtime.launcher import launch

    recipe = Path(__file__).resolve().parent.parent / "recipes" / "cpu_tiny_grpo.sh"
    recipes = [f"{recipe} actor_rollout_ref.rollout.seed=7", f"{recipe} actor_rollout_ref.rollout.seed=11"]
    _progress(
        f"demo 2/2: two tiny GRPO pipelines ({recipe.name}, sampling seeds 7 and 11) multiplexed on one pool of 2 "
        f"CPU slots by the jigsaw scheduler, 3 steps each (239 s here, most of it the start-ups, one after the other); "
        f"outputs in {out / 'mux'}/"
    )
    result = launch(recipes, group="demo", pool_slots=2, policy="jigsaw", out=str(out / "mux"), progress=_progress)
    return result["rc"]


def cmd_mux(args: argparse.Namespace) -> int:
    from jigsaw_verl.runtime.launcher import RecipeRefused, launch

    if args.pool_slots < 1:
        raise UsageError(f"--pool-slots must be >= 1, got {args.pool_slots}")
    try:
        result = launch(
            args.recipes,
            group=args.group,
            pool_slots=args.pool_slots,
            pool_nodes=args.pool_nodes,
            policy=args.policy,
            device=args.device,
            gpu=args.gpu,
            out=args.out,
            pin_cores=args.pin_cores,
            progress=_progress,
        )
    except RecipeRefused as err:
        raise UsageError(*err.lines) from None
    except (FileNotFoundError, ValueError) as err:
        raise UsageError(str(err)) from None
    return result["rc"]


def cmd_check(args: argparse.Namespace) -> int:
    """Every pre-Ray check the entry point runs on a recipe, as the launcher would run it in a group."""
    from jigsaw_verl.runtime.recipe_entry import check_recipes, group_overrides

    recipe = [args.recipe, *args.overrides]
    if not Path(args.recipe).is_file():
        raise UsageError(f"recipe not found: {args.recipe}")
    appended = group_overrides(args.group, args.policy, pool_slots=args.pool_slots, pool_nodes=args.pool_nodes)
    (check,) = check_recipes([recipe], [appended])
    if not check.ok:
        raise UsageError(*(f"{args.recipe}: {line}" for line in check.problems))
    spec = check.spec
    model = spec["model"]
    print(f"{args.recipe}: can join a multiplexing group")
    print(
        f"  model {model['name']} ({model['params'] / 1e9:.3g} B parameters, {model['layers']} layers), "
        f"{spec['batch_prompts']} prompts x {spec['group_size']} responses a step, rollout TP {spec['rollout_tp']}"
    )
    print(f"  steps: {spec['steps']} ({check.steps_how})")
    print(f"  memory: {_memory_line(check.engine, check.slot_memory_bytes)}")
    print("  planning spec the group's scheduler would see:")
    print(json.dumps(spec, indent=2))
    return 0


def _memory_line(engine: dict, slot_bytes: float) -> str:
    """What the recipe's engine reserves and pins per slot, and the setting two such pipelines would share at."""
    from jigsaw_verl.model.engine_memory import ENGINE_FRACTION_KEY, EngineReservation, fitting_fraction

    pair = fitting_fraction([EngineReservation(**engine)] * 2, slot_bytes)
    return (
        f"its engine reserves {engine['fraction']:g} of a {slot_bytes / 2**20:.4g} MiB slot and it pins "
        f"{engine['pinned_bytes'] / 2**20:.3g} MiB there; two such pipelines share a slot at {ENGINE_FRACTION_KEY} "
        f"<= {pair:g}"
    )


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
    mux = sub.add_parser("mux", help="run several verl recipes multiplexed on one pool")
    mux.add_argument("recipes", nargs="+", help='recipe scripts, each optionally with overrides: "path.sh key=value"')
    mux.add_argument("--group", default="mux", help="group name (default: mux)")
    mux.add_argument("--pool-slots", type=int, default=2, help="slots in the shared pool (default: 2)")
    mux.add_argument(
        "--pool-nodes",
        type=int,
        default=1,
        help="Ray nodes the pool spans, --pool-slots / --pool-nodes slots on each (default: 1; join a multi-node "
        "cluster with RAY_ADDRESS)",
    )
    mux.add_argument("--policy", default="jigsaw", help="scheduling policy (default: jigsaw)")
    mux.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="slot kind (default: cpu)")
    mux.add_argument("--gpu", default=None, help="GPU type from the catalogue when --device cuda (e.g. H100-80G)")
    mux.add_argument("--out", default="out/mux", help="folder for logs, metrics, trace and plot (default: out/mux)")
    mux.add_argument(
        "--pin-cores",
        action="store_true",
        help="CPU: run each pool slot's workers and rollout servers on that slot's own cores (jigsaw.mux.pin_cores)",
    )
    mux.set_defaults(func=cmd_mux)
    check = sub.add_parser("check", help="run every pre-Ray check of a recipe as the launcher would, start nothing")
    check.add_argument("recipe", help="a verl recipe script (calling verl's main_ppo, or jigsaw_verl.main_ppo)")
    check.add_argument(
        "overrides", nargs="*", help="hydra overrides appended to the recipe's own (the options may stand anywhere)"
    )
    check.add_argument("--group", default="check", help="group name to check against (default: check)")
    check.add_argument("--pool-slots", type=int, default=None, help="slots of the group's pool (default: its own)")
    check.add_argument(
        "--pool-nodes", type=int, default=None, help="nodes of the group's pool (default: trainer.nnodes or 1)"
    )
    check.add_argument("--policy", default="jigsaw", help="scheduling policy (default: jigsaw)")
    check.set_defaults(func=cmd_check)
    demo = sub.add_parser("demo", help="the simulator, then two CPU pipelines multiplexed live")
    demo.add_argument("--out", default="out", help="folder for the demo's JSON, trace and plot (default: out)")
    demo.add_argument("--skip-recipe", action="store_true", help="only the simulation, not the multiplexed run")
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and args.command != "check":
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if unknown:  # check: what is not one of its options is the recipe's, in order (hydra says if it is not)
        args.overrides = [*args.overrides, *unknown]
    try:
        return args.func(args)
    except UsageError as err:
        for line in err.args:
            print(f"jigsaw-verl: error: {line}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("jigsaw-verl: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
