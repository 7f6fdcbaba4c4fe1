"""Register the CPU rollout's worker-side class under rollout name ``cpu``.

What: adds ``("cpu", "async") -> "jigsaw_verl.integration.cpu.rollout.adapter.CPUServerAdapter"`` to
``verl.workers.rollout.base._ROLLOUT_REGISTRY``.

Why: verl's hybrid worker builds its rollout with ``get_rollout_class(name, mode)``, which reads that
module-level dict; unlike ``RolloutReplicaRegistry`` (used for the server side) it has no ``register`` function.
"""

from __future__ import annotations

VERL_VERSIONS = ("0.9.1",)
KEY = ("cpu", "async")
TARGET = "jigsaw_verl.integration.cpu.rollout.adapter.CPUServerAdapter"


def is_applied() -> bool:
    from verl.workers.rollout import base

    return base._ROLLOUT_REGISTRY.get(KEY) == TARGET


def apply() -> None:
    from verl.workers.rollout import base

    existing = base._ROLLOUT_REGISTRY.get(KEY)
    if existing not in (None, TARGET):
        raise RuntimeError(f"rollout {KEY} is already registered to {existing}")
    base._ROLLOUT_REGISTRY[KEY] = TARGET
