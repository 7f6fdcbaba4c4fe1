"""Drop-in for verl's legacy ``RayPPOTrainer``: the same trainer, plus per-stage wall-clock timing.

For recipes that build the legacy trainer themselves (verl's ``main_ppo_v0.TaskRunner`` and the recipes modelled
on it), the one change is the import line::

    from jigsaw_verl.trainer import RayPPOTrainer  # was: from verl.trainer.ppo.ray_trainer import RayPPOTrainer

Built on ``verl/trainer/ppo/ray_trainer.py`` (verl 0.9.1). verl's ``fit`` runs unchanged; this subclass copies
none of its methods and only wraps the calls each stage of a step makes:

- ``rollout``: ``async_rollout_manager.generate_sequences`` (the agent loop, with verl's streamed reward) and
  ``rollout_sleep``: the ``checkpoint_manager.sleep_replicas`` that follows it;
- ``old_log_prob``, ``ref_log_prob``, ``values``: ``_compute_old_log_prob``, ``_compute_ref_log_prob``,
  ``_compute_values``;
- ``update_critic``, ``update_actor``: ``_update_critic``, ``_update_actor``;
- ``weight_sync``: ``checkpoint_manager.update_weights``;
- ``validate``: ``_validate`` (what it calls is not counted in the stages above);
- ``step``: from verl's per-step ``_start_profiling`` call to its ``_stop_profiling`` call.

Each step logs ``jigsaw/stage_s/<stage>`` through verl's own logger (verl hands the step's metrics dict to
``_balance_batch``, on by default; with ``trainer.balance_batch=false`` the timings are only kept in
:attr:`RayPPOTrainer.stage_timer`). Reward extraction and the advantage run on the driver between these calls and
hold no workers; verl logs them itself as ``timing_s/reward`` and ``timing_s/adv``. The
:class:`~jigsaw_verl.integration.trainer.timing.StageTimer` also turns every step into the core's
:class:`~jigsaw_verl.policy.interface.StageTiming` records (one per core stage: ``rollout``, ``logprob``,
``update``, ``weight_sync``), the input the predictor learns from.

``jigsaw.migration.*`` is not supported here yet. Migration needs verl's resuming LLM client in the agent loop and a
tail monitor around the rollout; the legacy ``init_workers`` builds its agent loop with the plain client. The route
that copies nothing is verl's ``actor_rollout_ref.rollout.agent.agent_loop_manager_class`` (a manager that swaps in
the migrating client) plus the tail monitor in the ``generate_sequences`` wrapper below; until then
``jigsaw.migration.enable=true`` (and ``jigsaw.enable=true``) with this trainer raises
:class:`LegacyMigrationError`: use ``python -m jigsaw_verl.main_ppo`` (verl's V1 trainer, trainer mode ``jigsaw``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from verl.trainer.ppo.ray_trainer import RayPPOTrainer as _VerlRayPPOTrainer

from jigsaw_verl.integration.settings import JigsawSettings
from jigsaw_verl.integration.trainer.timing import StageTimer

METRIC_PREFIX = "jigsaw/stage_s/"


class LegacyMigrationError(ValueError):
    """``jigsaw.migration.enable=true`` or ``jigsaw.enable=true`` was combined with the legacy trainer."""


def check_legacy_config(config) -> None:
    """Raise :class:`LegacyMigrationError` if ``config`` asks for what the legacy trainer cannot do."""
    settings = JigsawSettings.from_config(config)
    if settings.enable:
        raise LegacyMigrationError(
            "jigsaw.enable=true (pipeline multiplexing) runs verl's V1 trainer (python -m jigsaw_verl.main_ppo); "
            "the legacy RayPPOTrainer only times its stages"
        )
    if settings.migration.enable:
        raise LegacyMigrationError(
            "jigsaw.migration.enable=true needs verl's V1 trainer (python -m jigsaw_verl.main_ppo, trainer mode "
            "`jigsaw`); the legacy RayPPOTrainer builds its agent loop without the resuming client migration needs"
        )


def _timed(timer: StageTimer, name: str, fn: Callable) -> Callable:
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with timer.stage(name):
            return fn(*args, **kwargs)

    return wrapper


class RayPPOTrainer(_VerlRayPPOTrainer):
    """verl's legacy ``RayPPOTrainer``, timing every stage of every step (see the module docstring).

    Takes exactly verl's constructor arguments. Raises :class:`LegacyMigrationError` for
    ``jigsaw.migration.enable=true``.

    Attributes:
        stage_timer: the :class:`StageTimer` of this run.
    """

    def __init__(self, config, *args, **kwargs):
        check_legacy_config(config)
        super().__init__(config, *args, **kwargs)
        self.stage_timer = StageTimer(pipeline=str(config.trainer.experiment_name))
        self._jigsaw_metrics: dict | None = None

    def init_workers(self):
        super().init_workers()
        timer = self.stage_timer
        timer.gpus = self.resource_pool_manager.get_n_gpus()
        rollout, ckpt = self.async_rollout_manager, self.checkpoint_manager
        rollout.generate_sequences = _timed(timer, "rollout", rollout.generate_sequences)
        ckpt.sleep_replicas = _timed(timer, "rollout_sleep", ckpt.sleep_replicas)
        ckpt.update_weights = _timed(timer, "weight_sync", ckpt.update_weights)

    # verl calls these two at the start and at the end of every step of ``fit`` (profiling off or on)
    def _start_profiling(self, do_profile: bool) -> None:
        self.stage_timer.begin_step()
        self._jigsaw_metrics = None
        super()._start_profiling(do_profile)

    def _stop_profiling(self, do_profile: bool, run_command: bool = False) -> None:
        super()._stop_profiling(do_profile, run_command=run_command)
        seconds = self.stage_timer.end_step(self.global_steps)
        if self._jigsaw_metrics is not None:  # the dict verl logs for this step, once this call returns
            self._jigsaw_metrics.update({METRIC_PREFIX + k: v for k, v in seconds.items()})
        self._jigsaw_metrics = None

    def _balance_batch(self, batch, metrics, *args, **kwargs):
        self._jigsaw_metrics = metrics
        return super()._balance_batch(batch, metrics, *args, **kwargs)

    def _validate(self, *args, **kwargs):
        with self.stage_timer.stage("validate"):  # its rollout is not the step's rollout
            return super()._validate(*args, **kwargs)

    def _compute_old_log_prob(self, batch):
        with self.stage_timer.stage("old_log_prob"):
            return super()._compute_old_log_prob(batch)

    def _compute_ref_log_prob(self, batch):
        with self.stage_timer.stage("ref_log_prob"):
            return super()._compute_ref_log_prob(batch)

    def _compute_values(self, batch):
        with self.stage_timer.stage("values"):
            return super()._compute_values(batch)

    def _update_critic(self, batch):
        with self.stage_timer.stage("update_critic"):
            return super()._update_critic(batch)

    def _update_actor(self, batch):
        with self.stage_timer.stage("update_actor"):
            return super()._update_actor(batch)
