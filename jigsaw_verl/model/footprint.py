"""What a running stage of a pipeline needs resident on each of its slots: the one rule of memory admission.

The policy asks it before co-locating a stage (does it fit beside what a slot holds?), and the live executor asks
it to say what each slot holds (its snapshot's free memory): the same bytes in both places.
"""

from __future__ import annotations

from jigsaw_verl.model.graph import ROLLOUT
from jigsaw_verl.model.memory import rollout_weight_bytes, train_state_bytes
from jigsaw_verl.model.spec import PipelineSpec

# NOTE: a replica is admitted with room for the KV of a few of its longest sequences, not a full cache.
KV_SEQUENCES_ADMITTED = 4


def stage_resident_bytes(spec: PipelineSpec, stage: str, slots: int) -> float:
    """Per-slot bytes ``stage`` needs resident on ``slots`` slots: a rollout replica's weights (split over its
    tensor-parallel group) plus the KV of a few longest sequences, or the training state sharded over ``slots``."""
    if stage == ROLLOUT:
        longest = spec.prompt_len.max + spec.response_len.max
        kv = KV_SEQUENCES_ADMITTED * longest * spec.model.kv_bytes_per_token
        return (rollout_weight_bytes(spec.model) + kv) / spec.rollout_tp
    return train_state_bytes(spec.model, critic=spec.critic, ref_model=spec.ref_model) / slots
