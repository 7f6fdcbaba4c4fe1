"""Planning specs as plain JSON records and back: what a live group writes of the pipelines that joined it
(``group.json``), so a replay of the run (:mod:`jigsaw_verl.runtime.live_replay`) plans with the very specs the
live policy planned with."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from jigsaw_verl.model.catalogue import GPUSpec, ModelSpec
from jigsaw_verl.model.spec import LengthDist, PipelineSpec


def spec_record(spec: PipelineSpec | GPUSpec) -> dict[str, Any]:
    """A pipeline's planning spec or a slot's hardware as a JSON-ready dict."""
    return asdict(spec)


def pipeline_from_record(record: dict[str, Any]) -> PipelineSpec:
    """The :class:`PipelineSpec` of :func:`spec_record`'s dict (``ValueError`` naming what is missing)."""
    try:
        return PipelineSpec(
            **{
                **record,
                "model": ModelSpec(**record["model"]),
                "prompt_len": LengthDist(**record["prompt_len"]),
                "response_len": LengthDist(**record["response_len"]),
            }
        )
    except (KeyError, TypeError) as err:
        raise ValueError(f"not a pipeline spec record ({err}): keys {sorted(record)}") from None


def gpu_from_record(record: dict[str, Any]) -> GPUSpec:
    """The :class:`GPUSpec` of :func:`spec_record`'s dict."""
    try:
        return GPUSpec(**record)
    except TypeError as err:
        raise ValueError(f"not a slot hardware record ({err}): keys {sorted(record)}") from None
