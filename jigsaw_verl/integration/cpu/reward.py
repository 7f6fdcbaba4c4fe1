"""Rule-based reward of the tiny arithmetic dataset: 1 for the correct final number, else 0."""

from __future__ import annotations

import re

_NUMBER = re.compile(r"-?\d+")


def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info=None, **kwargs) -> float:
    """verl custom reward function (``reward.custom_reward_function``): the last integer in the response."""
    numbers = _NUMBER.findall(solution_str or "")
    return 1.0 if numbers and numbers[-1] == str(ground_truth).strip() else 0.0
