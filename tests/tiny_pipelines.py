"""The tiny GRPO pipelines the live multiplexing tests run, and each run alone (the reference a multiplexed run
must compute exactly): the bundled CPU recipe with two sampling seeds; ``b`` also consolidates its rollout tails.
The alone runs are made once per test session (:func:`run_alone`, the ``alone_runs`` fixture) and shared by the
one-node and the multi-node multiplexing tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "recipes" / "cpu_tiny_grpo.sh"
STEPS = 3
COMMON = ["trainer.logger=[console,file]"]
# two pipelines that differ in their sampling seed; b also consolidates its rollout tails (jigsaw.migration); a
# validates before training, b after its second and last steps (each validation runs under a lease of its own)
PIPELINES = {
    "a": ["actor_rollout_ref.rollout.seed=7", "trainer.val_before_train=True"],
    "b": ["actor_rollout_ref.rollout.seed=11", "jigsaw.migration.enable=true", "trainer.test_freq=2"],
}
# per pipeline, the steps after which it validates (0: before training)
VALIDATIONS = {"a": {0}, "b": {2, 3}}
LOSSES = ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm")


def env(**extra) -> dict:
    return dict(os.environ, PY=sys.executable, **extra)


def overrides(name: str, out: Path) -> list[str]:
    return [*COMMON, *PIPELINES[name], f"trainer.rollout_data_dir={out / name / 'rollouts'}"]


def run_alone(out: Path) -> dict:
    """Each pipeline alone through the bundled recipe (verl's V1 trainer in mode ``jigsaw``, no group), one after
    the other (on two cores two at once run slower than back to back). Returns ``{"rollouts": {name: folder},
    "metrics": {name: jsonl}}``."""
    found = {"rollouts": {}, "metrics": {}}
    for name in PIPELINES:
        log = out / f"alone-{name}.log"
        args = ["bash", str(RECIPE), f"trainer.total_training_steps={STEPS}", *overrides(name, out / "alone")]
        run_env = env(OUT=str(out / "alone" / name), VERL_FILE_LOGGER_PATH=str(out / f"alone-{name}.jsonl"))
        with log.open("w") as fh:
            rc = subprocess.run(
                [*args, "trainer.v1.trainer_mode=jigsaw"], env=run_env, stdout=fh, stderr=subprocess.STDOUT,
                timeout=900,
            ).returncode  # fmt: skip
        assert rc == 0, log.read_text()[-3000:]
        found["rollouts"][name] = out / "alone" / name / "rollouts"
        found["metrics"][name] = out / f"alone-{name}.jsonl"
    return found


def steps(path: Path) -> dict[int, dict]:
    """Per step, the metrics a run logged (verl's file logger)."""
    return {row["step"]: row["data"] for row in map(json.loads, path.read_text().splitlines())}


def rollouts(folder: Path) -> dict[int, list[tuple]]:
    """Per step, every sample's prompt, response text and reward, sorted (uids are random per run)."""
    out = {}
    for f in sorted(folder.glob("*.jsonl")):
        rows = [json.loads(line) for line in f.read_text().splitlines()]
        out[int(f.stem)] = sorted((r["input"], r["output"], r["score"]) for r in rows)
    return out
