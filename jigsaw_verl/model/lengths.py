"""Sampling prompt and response lengths for every step of a pipeline.

Lengths are log-normal: ``log L ~ N(log median, sigma)`` with ``sigma = log(p99 / median) / z99``, rounded and
clipped to ``[1, max]``. One prompt's ``group_size`` responses share a latent draw with correlation
``group_corr`` (siblings of a GRPO group have correlated lengths); the response median moves by ``drift`` per
step (the length profile drifts slowly). The same (workload seed, pipeline name) always gives the same lengths.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from jigsaw_verl.model.spec import LengthDist, PipelineSpec

Z99 = 2.3263478740408408  # standard normal 99th percentile


@dataclass(frozen=True, eq=False)
class StepSamples:
    """The responses of one step. Arrays are read-only, one entry per response, grouped prompt by prompt.

    Attributes:
        step: step index.
        prompt_len: prompt tokens of each response's prompt, int64.
        response_len: response tokens, int64, in [1, response max].
        group: index of the prompt each response belongs to, int64.
    """

    step: int
    prompt_len: np.ndarray
    response_len: np.ndarray
    group: np.ndarray

    @property
    def tokens(self) -> int:
        """Prompt + response tokens of the step."""
        return int(self.prompt_len.sum() + self.response_len.sum())


def _lognormal(dist: LengthDist, median: float, z: np.ndarray) -> np.ndarray:
    sigma = np.log(dist.p99 / dist.median) / Z99
    return np.clip(np.rint(median * np.exp(sigma * z)), 1, dist.max).astype(np.int64)


def sample_steps(spec: PipelineSpec, seed: int) -> tuple[StepSamples, ...]:
    """All steps' lengths for ``spec`` under the workload ``seed``."""
    rng = np.random.default_rng([seed, zlib.crc32(spec.name.encode())])
    n, g = spec.batch_prompts, spec.group_size
    rho = spec.response_len.group_corr
    group = np.repeat(np.arange(n, dtype=np.int64), g)
    group.setflags(write=False)
    steps = []
    for k in range(spec.steps):
        prompt = np.repeat(_lognormal(spec.prompt_len, spec.prompt_len.median, rng.standard_normal(n)), g)
        z = np.sqrt(rho) * np.repeat(rng.standard_normal(n), g) + np.sqrt(1.0 - rho) * rng.standard_normal(n * g)
        median = spec.response_len.median * (1.0 + spec.response_len.drift) ** k
        response = _lognormal(spec.response_len, median, z)
        prompt.setflags(write=False)
        response.setflags(write=False)
        steps.append(StepSamples(step=k, prompt_len=prompt, response_len=response, group=group))
    return tuple(steps)
