"""Benchmark the JigsawRL scheduler against the baselines in simulation, plus its decision latency.

Usage: ``python scripts/bench_sim.py [--json out/bench.json] [--md out/bench.md] [--latency-only]
[--whole-run-at-scale]``.

Per bundled workload and policy (every figure from one process, side by side, on the same sampled lengths):
makespan, tokens/s, the ratio to ``verl`` and to the best of ``streamrl``/``areal``/``rollmux`` (> 1 is faster),
makespan over the lower bound of the staleness the policy uses, mean and max per-pipeline latency inflation,
requests migrated, and the GPU time re-prefill took as a share of the GPU time migrations freed. The ablations
are in the same table: ``jigsaw-no-migration``, ``jigsaw-no-colocation``, ``jigsaw-wide-start`` (a rollout may
start on the whole free pool) and ``greedy`` (no look-ahead), and on
the elastic-tail what-if (the long-CoT workload with ``rollout_elastic_tp: 4``, simulation only)
``jigsaw-no-elastic-tail``. The predictor's error per stage is reported for ``jigsaw``.

Decision latency: synthetic workloads of 8 GPUs x 2 pipelines, 64 x 8 and 1024 x 64 are simulated under
``greedy`` to their end (the largest stops sampling after ten minutes of simulating, a cap it does not reach here;
``--whole-run-at-scale`` lifts it); ``jigsaw.schedule`` is then timed on 60 snapshots evenly spread over the
decisions sampled (p50/p99 over snapshots of one call, the median of 3 per snapshot, this machine's CPU).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

import numpy as np

from jigsaw_verl.model.spec import WorkloadSpec, workload_from_dict
from jigsaw_verl.model.workload_file import BUNDLED_DIR, bundled_workloads, load_workload
from jigsaw_verl.policy.jigsaw.knobs import JigsawKnobs
from jigsaw_verl.policy.jigsaw.lookahead import LookAheadPolicy
from jigsaw_verl.sim.predictor_report import predictor_error
from jigsaw_verl.sim.runner import Runner
from jigsaw_verl.sim.simulator import Simulator

POLICIES = [
    "verl",
    "verl-seq",
    "streamrl",
    "areal",
    "rollmux",
    "greedy",
    "jigsaw-no-migration",
    "jigsaw-no-colocation",
    "jigsaw-wide-start",
    "jigsaw",
]
PEERS = ("streamrl", "areal", "rollmux")
# What-ifs: a bundled workload whose pipelines may move their tails onto wider replicas (``rollout_elastic_tp``;
# simulation only, verl 0.9.1 builds replicas at one TP), benchmarked with the ``jigsaw-no-elastic-tail`` ablation.
ELASTIC_WHAT_IFS = (("longcot-qwen3-4b-x2-8xh100", 4),)
SCALES = ((8, 2), (64, 8), (1024, 64))
SAMPLING_BUDGET_S = 600.0  # seconds of simulating 1024 x 64 before sampling stops (unless --whole-run-at-scale)


def migration_figures(result) -> tuple[int, float, float]:
    """(requests migrated, re-prefill GPU-seconds on targets, GPU-seconds the migrations freed)."""
    moved = sum(m.requests for m in result.migrations)
    freed = sum(m.freed_gpu_s for m in result.migrations)
    reprefill = sum((s.end_s - s.start_s) * len(s.gpus) for s in result.slices if s.name == "reprefill")
    return moved, (reprefill if result.migrations else 0.0), freed


def with_elastic_tail(w: WorkloadSpec, tp: int) -> WorkloadSpec:
    """``w`` with every pipeline's tail allowed to move onto a replica of ``tp`` GPUs (a what-if: simulation only)."""
    pipes = tuple(dataclasses.replace(p, rollout_elastic_tp=tp) for p in w.pipelines)
    return dataclasses.replace(w, name=f"{w.name}+elastic-tp{tp}", pipelines=pipes)


def bench_workload(w: WorkloadSpec, extra: tuple[str, ...] = ()) -> dict:
    runner = Runner(w, progress=lambda line: print(f"  {w.name}: {line}", file=sys.stderr))
    policies = POLICIES + list(extra)
    infeasible = runner.infeasible(policies)
    rep = runner.report([p for p in policies if p not in infeasible])
    peers = [rep.metrics[p].makespan_s for p in PEERS if p in rep.metrics]
    peer = min(peers) if peers else None
    out = {"workload": w.name, "lower_bound_s": rep.lower_bound.makespan_s, "policies": {}, "infeasible": infeasible}
    for name, m in rep.metrics.items():
        infl = [pm.latency_inflation for pm in m.pipelines.values()]
        moved, reprefill, freed = migration_figures(rep.results[name])
        out["policies"][name] = {
            "config": m.config,
            "makespan_s": m.makespan_s,
            "tokens_per_s": m.tokens_per_s,
            "vs_verl": m.ratio_vs_verl,
            "vs_best_peer": None if peer is None else peer / m.makespan_s,
            "over_bound": m.makespan_s / m.lower_bound_s,
            "mean_inflation": float(np.mean(infl)),
            "max_inflation": float(np.max(infl)),
            "migrated_requests": moved,
            "reprefill_gpu_s": reprefill,
            "freed_gpu_s": freed,
            "reprefill_pct_of_freed": 100.0 * reprefill / freed if freed > 0 else None,
        }
    err = predictor_error(w, rep.results["jigsaw"], runner.cost)
    out["predictor_error_jigsaw"] = {"mean": err.mean, "max": err.max}
    return out


def synthetic(num_gpus: int, pipelines: int) -> dict:
    """A pool of ``num_gpus`` H100s shared by ``pipelines`` small GRPO jobs (two model sizes, short CoT)."""
    pipes = [
        {
            "name": f"p{i}",
            "model": "qwen3-0.6b" if i % 2 else "qwen3-4b",
            "batch_prompts": 16,
            "group_size": 4,
            "prompt_len": {"median": 100, "p99": 300, "max": 512},
            "response_len": {"median": 300, "p99": 2000, "max": 2048, "group_corr": 0.5, "drift": 0.02},
            "train_micro_batch_tokens": 8192,
            "steps": 3,
            "arrival_s": float(i % 4),
        }
        for i in range(pipelines)
    ]
    return {
        "name": f"synthetic-{num_gpus}x{pipelines}",
        "cluster": {"gpu": "H100-80G", "num_gpus": num_gpus, "gpus_per_node": 8},
        "pipelines": pipes,
    }


class _Enough(Exception):
    pass


def decision_latency(
    num_gpus: int, pipelines: int, samples: int = 60, repeats: int = 3, budget_s: float | None = None
) -> dict:
    """p50/p99 milliseconds of one ``jigsaw`` decision on snapshots sampled from a ``greedy`` run: every decision
    with a ready stage over the whole run (``budget_s`` ``None``) or over its first ``budget_s`` seconds of
    simulating (at 1024 GPUs the whole run takes long), then ``samples`` of them evenly spread (kept as the run
    goes: every ``stride``-th decision, the stride doubling whenever ``2 * samples`` are kept, so a run of tens of
    thousands of decisions does not keep every snapshot of a thousand GPUs in memory). Each is timed
    ``repeats`` times, round robin (so consecutive calls see different snapshots, as in a run), and its median
    counts: one call's time, without the spikes of other processes preempting this one on a shared machine."""
    w = workload_from_dict(synthetic(num_gpus, pipelines), f"synthetic-{num_gpus}x{pipelines}")
    greedy = LookAheadPolicy(w, JigsawKnobs(horizon=0, migration=False), name="greedy")
    jigsaw = LookAheadPolicy(w, JigsawKnobs(), name="jigsaw")
    for p in w.pipelines:  # priors are built once per pipeline at first use, not per decision
        jigsaw.planning.pred.prior(p.name)
    snaps, began = [], time.perf_counter()
    inner = greedy.schedule
    seen, stride, last_s = 0, 1, 0.0  # every stride-th decision is kept; the stride doubles as the run goes

    def sample(snap):
        nonlocal seen, stride, snaps, last_s
        if snap.ready:
            last_s = snap.now_s
            if seen % stride == 0:
                snaps.append(snap)
            seen += 1
            if len(snaps) >= 2 * samples:
                snaps, stride = snaps[::2], 2 * stride
            if budget_s is not None and time.perf_counter() - began > budget_s:
                raise _Enough
        return inner(snap)

    greedy.schedule = sample
    whole = True
    try:
        makespan = Simulator(w, greedy).run().makespan_s
    except _Enough:
        whole, makespan = False, None
    simulate_wall_s = time.perf_counter() - began
    if len(snaps) > samples:
        snaps = [snaps[round(i * (len(snaps) - 1) / (samples - 1))] for i in range(samples)]
    times: list[list[float]] = [[] for _ in snaps]
    for _ in range(repeats):
        for i, snap in enumerate(snaps):
            t = time.perf_counter()
            jigsaw.schedule(snap)
            times[i].append(1e3 * (time.perf_counter() - t))
    one = [float(np.median(t)) for t in times]
    return {
        "gpus": num_gpus,
        "pipelines": pipelines,
        "decisions": len(one),
        "decisions_in_run": seen,
        "simulated_s": last_s,
        "whole_run": whole,
        "makespan_s": makespan,
        "simulate_wall_s": simulate_wall_s,
        "p50_ms": float(np.percentile(one, 50)),
        "p99_ms": float(np.percentile(one, 99)),
    }


def markdown(results: list[dict], latency: list[dict]) -> str:
    lines = [
        "| workload | policy | makespan s | tokens/s | vs verl | vs best peer | vs bound | mean infl. | max infl. "
        "| migrated | re-prefill % of freed |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        for name, m in r["policies"].items():
            pct, peer = m["reprefill_pct_of_freed"], m["vs_best_peer"]
            lines.append(
                f"| {r['workload']} | {name} | {m['makespan_s']:.0f} | {m['tokens_per_s']:,.0f} | {m['vs_verl']:.2f}x "
                f"| {'-' if peer is None else f'{peer:.2f}x'} | {m['over_bound']:.2f}x | {m['mean_inflation']:.2f}x "
                f"| {m['max_inflation']:.2f}x | {m['migrated_requests']} | {'-' if pct is None else f'{pct:.1f}%'} |"
            )
        lines.append(f"| {r['workload']} | *lower bound* | {r['lower_bound_s']:.0f} | | | | | | | | |")
        for name in r["infeasible"]:
            lines.append(f"| {r['workload']} | {name} | cannot run this pool | | | | | | | | |")
    lines += ["", "| predictor (jigsaw runs) | rollout | log-prob | update |", "|---|---:|---:|---:|"]
    for r in results:
        e = r["predictor_error_jigsaw"]
        cells = " | ".join(f"{100 * e['mean'][s]:.0f}% (max {100 * e['max'][s]:.0f}%)" for s in e["mean"])
        lines.append(f"| {r['workload']} | {cells} |")
    lines += [
        "",
        "| decision latency | decisions timed (of the run's) | sampled up to simulated s | whole run | p50 ms "
        "| p99 ms |",
        "|---|---:|---:|---|---:|---:|",
    ]
    for d in latency:
        extent = f"yes ({d['makespan_s']:.0f} s" if d["whole_run"] else "no (first part"
        whole = f"{extent}; simulated in {d['simulate_wall_s']:.0f} s)"
        lines.append(
            f"| {d['gpus']} GPUs x {d['pipelines']} pipelines | {d['decisions']} ({d['decisions_in_run']:,}) "
            f"| {d['simulated_s']:.1f} | {whole} "
            f"| {d['p50_ms']:.2f} | {d['p99_ms']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="write all figures here")
    ap.add_argument("--md", help="also write the markdown table here")
    ap.add_argument("--latency-only", action="store_true", help="skip the workloads, time decisions only")
    ap.add_argument(
        "--whole-run-at-scale",
        action="store_true",
        help=f"no cap on simulating the 1024 x 64 run (else sampling stops after {SAMPLING_BUDGET_S:.0f} s of it)",
    )
    args = ap.parse_args(argv)
    start = time.time()
    results = []
    if not args.latency_only:
        results = [bench_workload(load_workload(f)) for f in bundled_workloads()]
        for name, tp in ELASTIC_WHAT_IFS:
            w = with_elastic_tail(load_workload(BUNDLED_DIR / f"{name}.yaml"), tp)
            results.append(bench_workload(w, extra=("jigsaw-no-elastic-tail",)))
    latency = []
    for gpus, pipes in SCALES:
        print(f"  timing decisions at {gpus} x {pipes}", file=sys.stderr)
        budget = None if gpus <= 64 or args.whole_run_at_scale else SAMPLING_BUDGET_S
        latency.append(decision_latency(gpus, pipes, budget_s=budget))
    table = markdown(results, latency)
    print(table)
    print(f"\n({time.time() - start:.0f} s)", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"workloads": results, "decision_latency": latency}, fh, indent=2)
    if args.md:
        with open(args.md, "w") as fh:
            fh.write(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
