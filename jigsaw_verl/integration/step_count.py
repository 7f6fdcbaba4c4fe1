"""How many steps a verl run trains, before Ray starts, by verl's own rule.

verl's trainer (``verl/trainer/ppo/v1/trainer_base.py: _init_dataloader``) trains ``trainer.total_training_steps``
when it is set, else ``len(train_dataset) // data.train_batch_size * trainer.total_epochs``, where the dataset is
the rows of ``data.train_files`` (at most ``data.train_max_samples``), less the prompts
``data.filter_overlong_prompts`` drops. Before Ray only the files' row counts are at hand, so
:func:`planned_steps` counts them (parquet metadata, JSON lines) and gives that rule's figure as an upper bound; a
pipeline joins its group with the count its trainer really computed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from jigsaw_verl.integration.settings import JigsawConfigError


@dataclass(frozen=True, kw_only=True)
class StepCount:
    """The steps a run trains and how that was found.

    Attributes:
        steps: the step count (an upper bound when derived while prompts may still be filtered out).
        how: one line saying where it came from.
    """

    steps: int
    how: str


def planned_steps(config) -> StepCount:
    """``trainer.total_training_steps``, else verl's rule over ``data.train_files``; raises
    :class:`JigsawConfigError` naming the key when neither gives a positive count."""
    explicit = config.trainer.get("total_training_steps")
    if explicit is not None:
        if int(explicit) < 1:
            raise JigsawConfigError(f"trainer.total_training_steps={explicit}: a run trains at least one step")
        return StepCount(steps=int(explicit), how="trainer.total_training_steps")
    epochs, batch = int(config.trainer.total_epochs), int(config.data.train_batch_size)
    files = config.data.get("train_files")
    files = [files] if isinstance(files, str) else list(files or [])
    if not files:
        raise JigsawConfigError("data.train_files is not set: the step count comes from its rows")
    rows = sum(_rows(str(f)) for f in files)
    cap = int(config.data.get("train_max_samples", -1) or -1)
    used = min(rows, cap) if cap > 0 else rows
    steps = used // batch * epochs
    if steps < 1:
        raise JigsawConfigError(
            f"trainer.total_epochs={epochs} over {used} rows of data.train_files at data.train_batch_size={batch} "
            "trains no step: set trainer.total_training_steps, more epochs or a smaller batch"
        )
    filtered = config.data.get("filter_overlong_prompts")
    filtered = " (at most: data.filter_overlong_prompts may drop rows)" if filtered else ""
    return StepCount(steps=steps, how=f"{used} rows // {batch} prompts x {epochs} epochs{filtered}")


def _rows(path: str) -> int:
    """Rows of one data file verl reads (parquet, JSON lines, a JSON array); refused for what cannot be counted."""
    local = Path(path).expanduser()
    if "://" in path:
        raise JigsawConfigError(
            f"data.train_files: {path} is not a local file, so the step count cannot be derived before the run; "
            "set trainer.total_training_steps"
        )
    if not local.is_file():
        raise JigsawConfigError(
            f"data.train_files: {path} does not exist here (the step count comes from its rows); prepare the data "
            "first or set trainer.total_training_steps"
        )
    try:
        if path.endswith(".parquet"):
            import pyarrow.parquet as pq

            return pq.ParquetFile(local).metadata.num_rows
        if path.endswith(".jsonl"):
            return sum(1 for line in local.open() if line.strip())
        if path.endswith(".json"):
            text = local.read_text()
            data = json.loads(text) if text.lstrip().startswith("[") else None
            return len(data) if data is not None else sum(1 for line in text.splitlines() if line.strip())
    except (OSError, ValueError) as err:
        raise JigsawConfigError(f"data.train_files: cannot read {path}: {err}") from None
    raise JigsawConfigError(f"data.train_files: {path} is not parquet or JSON (what verl's dataset reads)")
