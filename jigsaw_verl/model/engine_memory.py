"""The memory rule of a shared slot: every rollout engine's reservation plus what stays resident must fit at once.

A rollout engine reserves ``gpu_memory_utilization`` x the device's memory when it starts and whenever it wakes
(vLLM: weights, activations and the KV pool; its start-up refuses a device with less free memory than that). The
pipelines sharing a slot start and wake their engines at times the scheduler does not control (start-up, verl's
weight sync), and what a pipeline keeps resident outside every lease (its *pinned* bytes: the training state of a
pipeline that does not offload) is there all the time. So a slot takes a
set of pipelines only if their reservations plus their pinned bytes fit in the slot's usable memory
(:func:`~jigsaw_verl.model.memory.usable_bytes`). Checked before Ray (``jigsaw-verl check``, the launcher, the entry
point) and again at join by the group's executor, with the same function.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from jigsaw_verl.model.memory import RESERVED_FRACTION

# the verl key the rule names when it refuses
ENGINE_FRACTION_KEY = "actor_rollout_ref.rollout.gpu_memory_utilization"


@dataclass(frozen=True, kw_only=True)
class EngineReservation:
    """What one pipeline holds on each slot it lives on, outside the scheduler's control.

    Attributes:
        pipeline: the pipeline's name in its group.
        slots: slots it lives on (its home).
        fraction: its rollout engine's ``gpu_memory_utilization`` (0 < fraction <= 1).
        pinned_bytes: bytes per slot it keeps resident outside every lease (the training state when it does not
            offload).
    """

    pipeline: str
    slots: int
    fraction: float
    pinned_bytes: float


def fitting_fraction(sharing: list[EngineReservation], memory_bytes: float) -> float:
    """The largest ``gpu_memory_utilization``, in hundredths, that every pipeline of ``sharing`` could use on one
    slot of ``memory_bytes`` beside everyone's pinned bytes (0 when none would fit)."""
    room = 1.0 - RESERVED_FRACTION - sum(r.pinned_bytes for r in sharing) / memory_bytes
    return max(0.0, math.floor(100 * room / max(1, len(sharing)) + 1e-9) / 100)


def slot_memory_refusal(sharing: list[EngineReservation], memory_bytes: float, slot: int) -> str | None:
    """One line naming :data:`ENGINE_FRACTION_KEY` and the value that would fit, when the pipelines ``sharing``
    slot ``slot`` (of ``memory_bytes``) cannot hold their engines and pinned bytes at once; else ``None``."""
    need = sum(r.fraction * memory_bytes + r.pinned_bytes for r in sharing)
    usable = (1.0 - RESERVED_FRACTION) * memory_bytes
    if need <= usable * (1 + 1e-9):
        return None
    held = ", ".join(
        f"{r.pipeline!r} {r.fraction:g}" + (f" + {r.pinned_bytes / memory_bytes:.2f} pinned" if r.pinned_bytes else "")
        for r in sharing
    )
    fit = fitting_fraction(sharing, memory_bytes)
    advice = (
        f"{ENGINE_FRACTION_KEY}={fit:g} for each would fit" if fit > 0 else "no engine fits beside the pinned state"
    )
    return (
        f"{ENGINE_FRACTION_KEY}: slot {slot} holds {held} of its memory, {need / memory_bytes:.2f} in all, but "
        f"{1 - RESERVED_FRACTION:.2f} is usable ({RESERVED_FRACTION:.2f} kept for contexts and activations); {advice}"
    )
