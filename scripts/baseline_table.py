"""The README's baseline table: every baseline on every bundled workload, as markdown.

Usage: ``python scripts/baseline_table.py [--json F]``. All figures come from one process, side by side, on the
same sampled lengths; ratios are to ``verl`` (the faster of its sequential and static-split forms).
"""

from __future__ import annotations

import argparse
import json
import sys

from jigsaw_verl.model.workload_file import bundled_workloads, load_workload
from jigsaw_verl.sim.runner import DEFAULT_POLICIES, Runner


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="also write every report's JSON here")
    args = ap.parse_args(argv)
    reports = {}
    print(
        "| workload | policy | makespan s | tokens/s | vs verl | vs bound | GPU busy | MFU | mean inflation | config |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for f in bundled_workloads():
        w = load_workload(f)
        runner = Runner(w, progress=lambda line: print(line, file=sys.stderr))
        infeasible = runner.infeasible(DEFAULT_POLICIES)
        rep = runner.report([p for p in DEFAULT_POLICIES if p not in infeasible])
        reports[w.name] = rep.to_json()
        for name, m in rep.metrics.items():
            infl = sum(p.latency_inflation for p in m.pipelines.values()) / len(m.pipelines)
            print(
                f"| {w.name} | {name} | {m.makespan_s:.0f} | {m.tokens_per_s:,.0f} | {m.ratio_vs_verl:.2f}x | "
                f"{m.makespan_s / m.lower_bound_s:.2f}x | {100 * m.gpu_busy_frac:.0f}% | {100 * m.mfu:.1f}% | "
                f"{infl:.2f}x | {m.config} |"
            )
        lb = rep.lower_bound
        print(
            f"| {w.name} | *lower bound* | {lb.makespan_s:.0f} | | | | | | | on-policy; one-step-off: "
            f"{rep.lower_bound_relaxed.makespan_s:.0f} s |"
        )
        for name in infeasible:
            print(f"| {w.name} | {name} | cannot run this pool | | | | | | | no configuration fits |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(reports, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
