"""Plain-text tables of a :class:`~jigsaw_verl.sim.runner.SimulationReport`."""

from __future__ import annotations

from jigsaw_verl.sim.runner import SimulationReport


def _rows(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    line = lambda r: "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    return "\n".join([line(header), "  ".join("-" * w for w in widths), *map(line, rows)])


def format_report(rep: SimulationReport) -> str:
    w = rep.workload
    out = [
        f"workload {w.name}: {len(w.pipelines)} pipelines on {w.cluster.num_gpus} x {w.cluster.gpu.name}",
        f"lower bound (on-policy, as declared): {rep.lower_bound.makespan_s:.1f} s "
        f"(work {rep.lower_bound.work_s:.1f} s, longest chain {rep.lower_bound.chain_s:.1f} s: "
        f"{rep.lower_bound.chain_pipeline}); one-step-off schedules: {rep.lower_bound_relaxed.makespan_s:.1f} s",
        "",
    ]
    header = ["policy", "makespan s", "tokens/s", "vs verl", "vs bound", "GPU busy", "MFU", "config"]
    rows = [
        [
            name,
            f"{m.makespan_s:.1f}",
            f"{m.tokens_per_s:,.0f}",
            f"{m.ratio_vs_verl:.2f}x",
            f"{m.makespan_s / m.lower_bound_s:.2f}x",
            f"{100 * m.gpu_busy_frac:.1f}%",
            f"{100 * m.mfu:.2f}%",
            m.config,
        ]
        for name, m in rep.metrics.items()
    ]
    out.append(_rows(header, rows))
    out.append("")
    pipes = [p.name for p in w.pipelines]
    header = ["policy"] + [f"{p}: step s (inflation)" for p in pipes]
    rows = [
        [name] + [f"{m.pipelines[p].mean_step_s:.1f} ({m.pipelines[p].latency_inflation:.2f}x)" for p in pipes]
        for name, m in rep.metrics.items()
    ]
    out.append(_rows(header, rows))
    out.append(
        "(inflation: mean step time over the same pipeline alone on the whole pool under verl-seq; "
        "'vs bound': makespan over the bound for the staleness the policy uses)"
    )
    return "\n".join(out)
