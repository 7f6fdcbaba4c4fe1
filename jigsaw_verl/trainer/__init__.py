"""verl trainer integration (the verl layer).

- :class:`RayPPOTrainer`: drop-in for verl's legacy ``verl.trainer.ppo.ray_trainer.RayPPOTrainer`` (one import
  line changes in a recipe), timing every stage of every step (:mod:`.legacy`);
- :mod:`.v1_jigsaw`: verl V1 trainer mode ``jigsaw`` (imported by the plugin when it registers trainer modes).

``RayPPOTrainer`` is imported on first access, so importing this package loads nothing of verl.
"""

from __future__ import annotations

__all__ = ["RayPPOTrainer"]


def __getattr__(name: str):
    if name == "RayPPOTrainer":
        from jigsaw_verl.integration.trainer.legacy import RayPPOTrainer

        return RayPPOTrainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
