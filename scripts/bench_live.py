"""The live gain, measured: the same two tail-heavy CPU recipes under verl-split, verl-seq, jigsaw and greedy.

Each configuration is one ``jigsaw-verl mux`` run of two ``recipes/cpu_countdown_grpo.sh`` pipelines (sampling
seeds 7 and 11) on a pool of 2 CPU slots, each slot pinned to its own core (``--pin-cores``), all through the one
mechanism (the group's scheduler applying a registered policy):

- ``verl-split``: each pipeline on its own slot (``trainer.n_gpus_per_node=1``), the two at once: a static split;
- ``verl-seq``: each pipeline on both slots, one after the other (the policy holds the second until the first is
  done);
- ``jigsaw`` and ``greedy``: each pipeline on both slots, multiplexed by the policy.

Per configuration it prints the steady-state makespan (first step's first lease to the last step's end), the wall
time with start-up, tokens/s, each pipeline's mean step time and its inflation over ``verl-seq`` (the pipeline
alone on the pool), the slots' busy fraction, and the makespan ratios to ``verl-split`` and ``verl-seq``. With
``--rounds`` above 1 the configurations run round robin and each figure is the median over rounds with its spread.

    PYTHONPATH=. .venv/bin/python scripts/bench_live.py --steps 8 --rounds 3 --json out/bench_live.json

``--steps 1 --rounds 1`` is the smoke the tests run.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from jigsaw_verl.integration.cpu.assets import build_tiny_assets
from jigsaw_verl.report.live_run import LiveRun, read_live_run
from jigsaw_verl.report.live_stage_times import alone_times, makespan_bound_s, shared_home_bound_s
from jigsaw_verl.runtime.replay_group import predict_group

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "cpu_countdown_grpo.sh"
POOL_SLOTS = 2
SEEDS = (7, 11)
# per configuration: the policy, and the slots each pipeline's workers take
CONFIGS = {
    "verl-split": ("verl-split", 1),
    "verl-seq": ("verl-seq", 2),
    "jigsaw": ("jigsaw", 2),
    "greedy": ("greedy", 2),
}
BATCH_PROMPTS, GROUP_SIZE = 16, 4  # the recipe's data.train_batch_size and rollout.n
# one slot's device memory for every configuration: the default scales an H100 by the model's size over 4B, in
# which one pipeline's training state does not fit one slot (verl-split would be refused); 64 MiB holds one
# pipeline's state and two rollout engines at the recipe's gpu_memory_utilization 0.4
SLOT_MEMORY_MIB = 64


def recipes(slots: int, steps: int, out: Path) -> list[str]:
    common = (
        f"trainer.n_gpus_per_node={slots} trainer.total_training_steps={steps} trainer.logger=[console,file] "
        f"jigsaw.mux.slot_memory_mib={SLOT_MEMORY_MIB}"
    )
    return [
        f"{RECIPE} actor_rollout_ref.rollout.seed={seed} trainer.rollout_data_dir={out / f'rollouts-seed{seed}'} "
        + common
        for seed in SEEDS
    ]


def rollouts(out: Path) -> dict[int, dict[int, list[tuple]]]:
    """Per sampling seed and step, every sample's prompt, response and reward, sorted (verl's rollout dumps)."""
    found = {}
    for seed in SEEDS:
        steps = {}
        for f in sorted((out / f"rollouts-seed{seed}").glob("*.jsonl")):
            rows = [json.loads(line) for line in f.read_text().splitlines()]
            steps[int(f.stem)] = sorted((r["input"], r["output"], r["score"]) for r in rows)
        found[seed] = steps
    return found


def run_config(name: str, steps: int, out: Path, log=print) -> LiveRun:
    """One configuration's ``jigsaw-verl mux`` run (a process of its own); raises if it fails."""
    policy, slots = CONFIGS[name]
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "jigsaw_verl.cli", "mux", *recipes(slots, steps, out.resolve())]
    cmd += ["--pool-slots", str(POOL_SLOTS), "--policy", policy, "--pin-cores", "--group", f"bench-{name}"]
    cmd += ["--out", str(out)]
    started = time.perf_counter()
    with (out / "launcher.log").open("w") as fh:
        rc = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, cwd=ROOT, timeout=3600).returncode
    wall = time.perf_counter() - started
    if rc != 0:
        raise RuntimeError(f"{name}: jigsaw-verl mux exited {rc}; see {out / 'launcher.log'}")
    (out / "wall_s.txt").write_text(f"{wall:.3f}\n")
    run = read_live_run(out, POOL_SLOTS, group_size=GROUP_SIZE, batch_prompts=BATCH_PROMPTS, wall_s=wall)
    log(f"bench_live: {name}: makespan {run.makespan_s:.1f} s, wall {wall:.0f} s")
    return run


def reread_config(name: str, out: Path, log=print) -> LiveRun:
    """A configuration's earlier run, read back from its folder (``--reuse``)."""
    if not (out / "leases.json").is_file():
        raise RuntimeError(f"{name}: --reuse: {out / 'leases.json'} is missing (run the benchmark without --reuse)")
    wall = float((out / "wall_s.txt").read_text()) if (out / "wall_s.txt").is_file() else None
    run = read_live_run(out, POOL_SLOTS, group_size=GROUP_SIZE, batch_prompts=BATCH_PROMPTS, wall_s=wall)
    log(f"bench_live: {name}: makespan {run.makespan_s:.1f} s (read back from {out})")
    return run


def same_as_alone(folders: dict[str, Path]) -> dict[str, bool]:
    """Per configuration whose pipelines run on the whole pool as in ``verl-seq``: whether each pipeline's responses
    and rewards in every step equal its ``verl-seq`` run's, where it ran alone (multiplexing must not change them)."""
    if "verl-seq" not in folders:
        return {}
    alone = rollouts(folders["verl-seq"])
    width = CONFIGS["verl-seq"][1]
    return {n: rollouts(f) == alone for n, f in folders.items() if n != "verl-seq" and CONFIGS[n][1] == width}


def predicted(folders: dict[str, Path]) -> dict[str, LiveRun]:
    """Per configuration, the replay of its group (:mod:`jigsaw_verl.runtime.replay_group`) from the stage times
    of the baselines of this round: ``verl-split`` for pipelines on one slot, ``verl-seq`` for pipelines on the
    whole pool. The baselines predict themselves from their own leases (a check of the replay); ``jigsaw`` and
    ``greedy`` are predicted from the baselines' alone."""
    baselines = {CONFIGS[b][1]: folders[b] for b in ("verl-split", "verl-seq") if b in folders}
    return {
        name: predict_group(folder, baselines, group_size=GROUP_SIZE, batch_prompts=BATCH_PROMPTS)
        for name, folder in folders.items()
        if CONFIGS[name][1] in baselines
    }


def bounds(folders: dict[str, Path], steps: int) -> dict[str, float]:
    """Per configuration, a lower bound on its steady-state makespan from both baselines' alone times: no schedule
    beats :func:`~jigsaw_verl.report.live_stage_times.makespan_bound_s` (each pipeline's chain alone on its fastest
    home, the slot-seconds of work over the pool), and with the configuration's homes the live executor cannot
    beat :func:`~jigsaw_verl.report.live_stage_times.shared_home_bound_s` (same-home rollouts one at a time)."""
    if not {"verl-split", "verl-seq"} <= set(folders):
        return {}
    widths = {CONFIGS[b][1]: alone_times(folders[b]) for b in ("verl-split", "verl-seq")}
    pool = makespan_bound_s(widths, POOL_SLOTS, steps)
    found = {}
    for name, folder in folders.items():
        joined = json.loads((folder / "group.json").read_text())["pipelines"]
        homes = {p["spec"]["name"]: tuple(p["home"]) for p in joined}
        found[name] = max(pool, shared_home_bound_s(widths[CONFIGS[name][1]], homes, steps))
    return found


def _figures(run: LiveRun, alone: LiveRun | None) -> dict[str, float]:
    figures = {
        "makespan_s": run.makespan_s,
        "wall_s": run.wall_s or 0.0,
        "tokens_per_s": run.tokens_per_s,
        "busy_fraction": run.busy_fraction,
    }
    for i, p in enumerate(sorted(run.pipelines.values(), key=lambda q: q.name)):
        figures[f"step_s_p{i}"] = p.mean_step_s
        if alone is not None:
            base = sorted(alone.pipelines.values(), key=lambda q: q.name)[i].mean_step_s
            figures[f"inflation_p{i}"] = p.mean_step_s / base if base else 0.0
    return figures


def summarize(rounds: list[dict[str, LiveRun]]) -> dict[str, dict[str, tuple[float, float, float]]]:
    """Per configuration and figure: (median, min, max) over rounds; the ratios are taken within each round."""
    table: dict[str, dict[str, list[float]]] = {}
    for runs in rounds:
        alone = runs.get("verl-seq")
        for name, run in runs.items():
            figures = _figures(run, alone)
            for base in ("verl-split", "verl-seq"):
                if base in runs:
                    figures[f"vs_{base}"] = runs[base].makespan_s / run.makespan_s
            for key, value in figures.items():
                table.setdefault(name, {}).setdefault(key, []).append(value)
    return {
        name: {k: (statistics.median(v), min(v), max(v)) for k, v in figures.items()} for name, figures in table.items()
    }


COLUMNS = (
    ("makespan_s", "makespan s", "{:.1f}"),
    ("wall_s", "wall s", "{:.0f}"),
    ("tokens_per_s", "tokens/s", "{:.0f}"),
    ("step_s_p0", "step s p0", "{:.2f}"),
    ("step_s_p1", "step s p1", "{:.2f}"),
    ("inflation_p0", "infl. p0", "{:.2f}x"),
    ("inflation_p1", "infl. p1", "{:.2f}x"),
    ("busy_fraction", "busy", "{:.0%}"),
    ("vs_verl-split", "vs verl-split", "{:.2f}x"),
    ("vs_verl-seq", "vs verl-seq", "{:.2f}x"),
)


def markdown(summary: dict[str, dict[str, tuple[float, float, float]]], rounds: int) -> str:
    """The table: each cell the median over rounds, with [min, max] when there were several."""
    lines = ["| configuration | " + " | ".join(label for _, label, _ in COLUMNS) + " |"]
    lines.append("|---|" + "---:|" * len(COLUMNS))
    for name, figures in summary.items():
        cells = []
        for key, _, fmt in COLUMNS:
            if key not in figures:
                cells.append("")
                continue
            med, lo, hi = figures[key]
            cells.append(fmt.format(med) + (f" [{fmt.format(lo)}, {fmt.format(hi)}]" if rounds > 1 else ""))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


PREDICTION_COLUMNS = ("makespan_s", "vs_verl-split", "vs_verl-seq")


def prediction_markdown(measured: dict, predicted: dict) -> str:
    """Measured beside predicted (medians over rounds), and each predicted ratio's error over the measured."""
    lines = [
        "| configuration | makespan s | predicted | vs verl-split | predicted | error | vs verl-seq | predicted "
        "| error |",
        "|---|" + "---:|" * 8,
    ]
    for name, figures in predicted.items():
        cells = [f"{measured[name]['makespan_s'][0]:.1f}", f"{figures['makespan_s'][0]:.1f}"]
        for key in PREDICTION_COLUMNS[1:]:
            if key not in figures:
                cells += ["", "", ""]
                continue
            real, guess = measured[name][key][0], figures[key][0]
            cells += [f"{real:.2f}x", f"{guess:.2f}x", f"{guess / real - 1:+.0%}"]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=8, help="training steps of each pipeline (default 8)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every configuration (default 3)")
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, of {', '.join(CONFIGS)}")
    parser.add_argument("--out", default="out/bench_live", help="folder for each run's files")
    parser.add_argument("--json", default=None, help="write the runs and the summary here")
    parser.add_argument("--reuse", action="store_true", help="read the runs already in --out instead of running them")
    args = parser.parse_args(argv)
    names = [n for n in args.configs.split(",") if n]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown or args.steps < 1 or args.rounds < 1:
        parser.error(f"--configs {args.configs}: known {', '.join(CONFIGS)}; --steps and --rounds must be >= 1")
    if not args.reuse:
        print("bench_live: building the countdown task's assets (once; ~4 min the first time)", flush=True)
        build_tiny_assets(task="countdown")
    rounds: list[dict[str, LiveRun]] = []
    predictions: list[dict[str, LiveRun]] = []
    floors: list[dict[str, float]] = []  # per round and configuration: a lower bound on its makespan
    exact: dict[str, list[bool]] = {}
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]  # round robin: drift spreads over configurations
        folders = {n: Path(args.out) / f"round{r}" / n for n in order}
        measure = reread_config if args.reuse else functools.partial(run_config, steps=args.steps)
        rounds.append({n: measure(n, out=folders[n]) for n in order})
        predictions.append(predicted(folders))
        floors.append(bounds(folders, args.steps))
        for name, same in same_as_alone(folders).items():
            exact.setdefault(name, []).append(same)
    summary = summarize(rounds)
    print(markdown(summary, args.rounds))
    forecast = summarize(predictions)
    if forecast:
        print("bench_live: the replay's prediction of each configuration (runtime/live_replay.py), beside the run")
        print(prediction_markdown(summary, forecast))
    for name in floors[0] if floors and all(floors) else ():
        floor = statistics.median(f[name] for f in floors)
        most = statistics.median(r["verl-split"].makespan_s / f[name] for r, f in zip(rounds, floors, strict=True))
        print(f"bench_live: {name}: makespan at least {floor:.1f} s (lower bound), so at most {most:.2f}x verl-split")
    for name, same in exact.items():
        print(
            f"bench_live: {name}: every step's responses and rewards equal verl-seq's (each pipeline alone on the "
            f"pool) in {sum(same)} of {len(same)} rounds"
        )
    if args.json:
        payload = {
            "steps": args.steps,
            "rounds": [{n: asdict(run) for n, run in rnd.items()} for rnd in rounds],
            "summary": summary,
            "predicted": [{n: asdict(run) for n, run in rnd.items()} for rnd in predictions],
            "predicted_summary": forecast,
            "makespan_bound_s": floors,
            "same_as_verl_seq": exact,
        }
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(payload, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
