"""Rule-based rewards of the tiny tasks (:mod:`jigsaw_verl.integration.cpu.tiny_tasks`), by the row's data source:
``arith``: 1 for the correct final number; ``countdown``: 1 when the response is the countdown, number for number."""

from __future__ import annotations

import re

from jigsaw_verl.integration.cpu.tiny_tasks import COUNTDOWN

_NUMBER = re.compile(r"-?\d+")


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info=None, **kwargs) -> float:
    """verl custom reward function (``reward.custom_reward_function``)."""
    numbers = _NUMBER.findall(solution_str or "")
    if data_source == COUNTDOWN.data_source:
        return 1.0 if numbers == str(ground_truth).split() else 0.0
    return 1.0 if numbers and numbers[-1] == str(ground_truth).strip() else 0.0
