"""Sweep the JigsawRL scheduler's knobs over the bundled workloads and shifted seeds, against ``greedy``.

A default must hold on workloads and seeds it was not chosen on, so each variant is run on every bundled workload
with its seed replaced by each of ``--seeds`` (other sampled lengths, the same shapes). Per run it prints every
variant's makespan and its speed over ``greedy`` (``greedy`` makespan / variant makespan, > 1 is faster); at the
end, per variant, the mean and the worst of those ratios.

With ``--peers streamrl,areal`` each run also simulates those baselines (their best configuration, as
``jigsaw-verl simulate`` picks it) and prints every variant's speed over the fastest of them, with the mean and
the worst at the end: the peer targets checked on seeds the bundled numbers were not made with.

Usage: ``python scripts/knob_sweep.py [--seeds 0,1,2,3] [--workloads a,b] [--peers a,b] VARIANT ...`` where a
variant is knob assignments such as ``horizon=2`` or ``horizon=2,min_gain=0.1`` (``JigsawKnobs`` fields; none:
the defaults).
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import fields, replace

import numpy as np

from jigsaw_verl.model.workload_file import bundled_workloads, load_workload
from jigsaw_verl.policy.jigsaw.knobs import JigsawKnobs
from jigsaw_verl.policy.jigsaw.lookahead import LookAheadPolicy
from jigsaw_verl.policy.registry import BASELINES
from jigsaw_verl.sim.runner import Runner
from jigsaw_verl.sim.simulator import Simulator

GREEDY = {"horizon": 0, "migration": False}


def parse_variant(text: str) -> dict:
    """``"horizon=2,min_gain=0.1"`` -> ``{"horizon": 2, "min_gain": 0.1}``; refuses a name that is no knob."""
    known = {f.name for f in fields(JigsawKnobs)}
    out = {}
    for part in filter(None, text.split(",")):
        key, _, value = part.partition("=")
        if key not in known:
            raise SystemExit(f"knob_sweep: {key!r} is not a JigsawKnobs field; known: {', '.join(sorted(known))}")
        out[key] = ast.literal_eval(value)
    return out


def makespan(workload, knobs: dict) -> float:
    return Simulator(workload, LookAheadPolicy(workload, JigsawKnobs(**knobs), name="sweep")).run().makespan_s


def best_peer_makespan(workload, peers: list[str]) -> float | None:
    """The smallest makespan of the ``peers`` that can run ``workload`` (each at its best configuration)."""
    if not peers:
        return None
    runner = Runner(workload)
    feasible = [p for p in peers if p not in runner.infeasible(peers)]
    return min((runner.run_policy(p).makespan_s for p in feasible), default=None)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("variants", nargs="*", help="knob assignments, e.g. horizon=2 (the defaults are always run)")
    ap.add_argument("--seeds", default="0,1,2,3", help="comma-separated workload seeds")
    ap.add_argument("--workloads", default="", help="comma-separated bundled workload names (default: all)")
    ap.add_argument("--peers", default="", help="comma-separated baselines to compare with, e.g. streamrl,areal")
    args = ap.parse_args(argv)
    peers = [p for p in args.peers.split(",") if p]
    if any(p not in BASELINES for p in peers):
        raise SystemExit(f"knob_sweep: --peers takes baselines from {', '.join(BASELINES)}; got {args.peers!r}")
    variants = [("defaults", {})] + [(v, parse_variant(v)) for v in args.variants]
    wanted = set(filter(None, args.workloads.split(",")))
    paths = [p for p in bundled_workloads() if not wanted or p.stem in wanted]
    ratios: dict[str, list[float]] = {name: [] for name, _ in variants}
    over_peer: dict[str, list[float]] = {name: [] for name, _ in variants}
    print("workload seed greedy-s " + " ".join(f"{name}-s (x greedy)" for name, _ in variants))
    for path in paths:
        for seed in (int(s) for s in args.seeds.split(",")):
            w = replace(load_workload(path), seed=seed)
            base = makespan(w, GREEDY)
            peer = best_peer_makespan(w, peers)
            cells = []
            for name, knobs in variants:
                m = makespan(w, knobs)
                ratios[name].append(base / m)
                cells.append(f"{m:.0f} ({base / m:.3f}x)")
                if peer is not None:
                    over_peer[name].append(peer / m)
                    cells[-1] += f" [{peer / m:.3f}x peer]"
            head = f"{path.stem} {seed} {base:.0f}" + (f" peer {peer:.0f}" if peer is not None else "")
            print(f"{head} " + " ".join(cells), flush=True)
    for name, rs in ratios.items():
        print(f"{name}: mean {np.mean(rs):.3f}x greedy, worst {min(rs):.3f}x over {len(rs)} runs")
        if over_peer[name]:
            rp = over_peer[name]
            print(f"{name}: mean {np.mean(rp):.3f}x the best of {args.peers}, worst {min(rp):.3f}x over {len(rp)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
