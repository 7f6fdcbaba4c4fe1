"""Utilisation plot of simulated and live runs: slots busy over time per run, stacked by pipeline."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from jigsaw_verl.pool.timeline import Timeline

BINS = 400


def busy_gpus(r: Timeline, pipelines: list[str], edges: np.ndarray) -> np.ndarray:
    """Mean GPUs busy per time bin, one row per pipeline (driver-side CPU sub-stages are not busy)."""
    out = np.zeros((len(pipelines), len(edges) - 1))
    width = edges[1] - edges[0]
    row = {p: i for i, p in enumerate(pipelines)}
    for s in r.slices:
        if s.bound == "cpu":
            continue
        lo = np.clip(edges[:-1], s.start_s, s.end_s)
        hi = np.clip(edges[1:], s.start_s, s.end_s)
        out[row[s.pipeline]] += (hi - lo) * len(s.gpus) / width
    return out


def write_plot(results: dict[str, Timeline], path: str | Path, *, title: str = "", ylabel: str = "GPUs busy") -> None:
    """A PNG with one panel per policy on a shared time axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pipelines = sorted({s.pipeline for r in results.values() for s in r.slices})
    horizon = max(r.end_s for r in results.values())
    edges = np.linspace(0.0, horizon, BINS + 1)
    mids = (edges[:-1] + edges[1:]) / 2
    fig, axes = plt.subplots(len(results), 1, figsize=(11, 1.7 * len(results) + 0.8), sharex=True, squeeze=False)
    for ax, (name, r) in zip(axes[:, 0], results.items()):
        ax.stackplot(mids, busy_gpus(r, pipelines, edges), labels=pipelines, step="mid", alpha=0.85)
        ax.axvline(r.end_s, color="k", lw=0.8, ls="--")
        ax.set_ylim(0, r.num_slots)
        ax.set_ylabel(ylabel)
        ax.set_title(f"{name}: makespan {r.end_s:.0f} s", fontsize=9, loc="left")
    axes[0, 0].legend(loc="upper right", fontsize=8, ncol=len(pipelines))
    axes[-1, 0].set_xlabel("time (s)")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
