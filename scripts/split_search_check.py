"""The pruned split search against the exhaustive one, and every baseline's wall time at 64 GPUs x 8 pipelines.

Usage: ``python scripts/split_search_check.py [--skip-exhaustive-at-scale] [--json F]``.

Part 1, per bundled workload and per searching baseline (``streamrl``, ``areal``: their rollout/training split;
``rollmux``: its rollout pool size): the makespan of the configuration the pruned search picks (the runner's
default) beside the exhaustive search's (every choice simulated), their ratio and both searches' wall times. The scaled
workload (each bundled long-CoT pipeline copied to 8 pipelines on 64 GPUs) is compared the same way.

Part 2: the wall time of every baseline (configurations built and run, as ``jigsaw-verl simulate`` does) on the
scaled workload; the target is at most 2 minutes each on this machine. Exit status 1 when a pruned makespan is
more than ``TOLERANCE`` above the exhaustive one or a baseline takes longer than ``BUDGET_S``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace

from jigsaw_verl.model.spec import ClusterSpec, WorkloadSpec
from jigsaw_verl.model.workload_file import bundled_workloads, load_workload
from jigsaw_verl.policy.registry import BASELINES
from jigsaw_verl.sim.runner import Runner

SEARCHING = ("streamrl", "areal", "rollmux")  # the policies whose choice the pruned search makes
TOLERANCE = 0.02  # the pruned split's makespan may be at most 2 % above the exhaustive search's
BUDGET_S = 120.0  # per baseline at 64 GPUs x 8 pipelines


def scaled(w: WorkloadSpec, num_gpus: int, pipelines: int) -> WorkloadSpec:
    """``w`` on ``num_gpus`` GPUs with its pipelines copied round robin to ``pipelines`` (each copy renamed, so
    its lengths are sampled anew)."""
    pipes = tuple(
        replace(w.pipelines[i % len(w.pipelines)], name=f"{w.pipelines[i % len(w.pipelines)].name}-{i}")
        for i in range(pipelines)
    )
    cluster = ClusterSpec(gpu=w.cluster.gpu, num_gpus=num_gpus, gpus_per_node=w.cluster.gpus_per_node)
    return replace(w, name=f"{w.name}-scaled-{num_gpus}x{pipelines}", cluster=cluster, pipelines=pipes)


def best_of(runner: Runner, name: str) -> tuple[float, str, float] | None:
    """(makespan, configuration, wall seconds: building its configurations and running them) of ``name``'s best
    configuration under ``runner``; ``None`` when no configuration fits the pool."""
    began = time.perf_counter()
    if not runner.configurations(name):
        return None
    result = runner.run_policy(name)
    return result.makespan_s, result.config, time.perf_counter() - began


def compare_searches(w: WorkloadSpec) -> list[dict]:
    pruned, exhaustive = Runner(w), Runner(w, exhaustive=True)
    rows = []
    for name in SEARCHING:
        pruned_best, exhaustive_best = best_of(pruned, name), best_of(exhaustive, name)
        if pruned_best is None or exhaustive_best is None:
            continue
        (p_s, p_cfg, p_wall), (e_s, e_cfg, e_wall) = pruned_best, exhaustive_best
        rows.append(
            {
                "workload": w.name,
                "policy": name,
                "pruned_s": p_s,
                "exhaustive_s": e_s,
                "pruned_over_exhaustive": p_s / e_s,
                "pruned_wall_s": p_wall,
                "exhaustive_wall_s": e_wall,
                "pruned_config": p_cfg,
                "exhaustive_config": e_cfg,
            }
        )
        print(
            f"  {w.name} {name}: pruned {p_s:.1f} s ({p_wall:.1f} s wall) vs exhaustive {e_s:.1f} s "
            f"({e_wall:.1f} s wall): {p_s / e_s:.4f}",
            file=sys.stderr,
        )
    return rows


def baseline_walls(w: WorkloadSpec) -> list[dict]:
    runner, rows = Runner(w), []
    for name in BASELINES:
        makespan, config, wall = best_of(runner, name)  # every baseline fits the scaled workload
        rows.append({"workload": w.name, "policy": name, "makespan_s": makespan, "wall_s": wall, "config": config})
        print(f"  {w.name} {name}: {makespan:.1f} s simulated in {wall:.1f} s", file=sys.stderr)
    return rows


def markdown(searches: list[dict], walls: list[dict]) -> str:
    lines = [
        "| workload | policy | pruned s | exhaustive s | pruned / exhaustive | search wall s (pruned, exhaustive) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in searches:
        lines.append(
            f"| {r['workload']} | {r['policy']} | {r['pruned_s']:.1f} | {r['exhaustive_s']:.1f} "
            f"| {r['pruned_over_exhaustive']:.4f} | {r['pruned_wall_s']:.1f}, {r['exhaustive_wall_s']:.1f} |"
        )
    lines += ["", "| workload | baseline | makespan s | wall s |", "|---|---|---:|---:|"]
    for r in walls:
        lines.append(f"| {r['workload']} | {r['policy']} | {r['makespan_s']:.1f} | {r['wall_s']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--skip-exhaustive-at-scale", action="store_true", help="compare the searches on bundled only")
    ap.add_argument("--json", help="write all figures here")
    args = ap.parse_args(argv)
    bundled = [load_workload(f) for f in bundled_workloads()]
    longcot = next(w for w in bundled if w.name.startswith("longcot-qwen3"))
    big = scaled(longcot, 64, 8)
    searches = [row for w in bundled for row in compare_searches(w)]
    if not args.skip_exhaustive_at_scale:
        searches += compare_searches(big)
    walls = baseline_walls(big)
    print(markdown(searches, walls))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"searches": searches, "baseline_walls": walls}, f, indent=2)
    bad = [r for r in searches if r["pruned_over_exhaustive"] > 1 + TOLERANCE]
    bad += [r for r in walls if r["wall_s"] > BUDGET_S]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
