"""verl V1 trainer mode ``jigsaw``: verl's synchronous trainer plus rollout tail migration and stage leases.

Built on ``verl/trainer/ppo/v1/trainer_sync.py`` (``PPOTrainerSync``) through verl's ``@register_trainer``: it
uses the hooks verl gives a trainer mode and copies none of its methods.
- ``get_llm_client``: verl's resuming client that also survives a dead replica;
- ``on_sample_begin`` / ``on_sample_end``: run the tail monitor while the batch generates, then put every
  migrated-from replica back into routing before verl sleeps the replicas and syncs weights;
- ``on_step_end``: log per step ``jigsaw/migrations``, ``jigsaw/migrated_requests``,
  ``jigsaw/reprefill_tokens`` and ``jigsaw/freed_replica_s`` through verl's logger.
With ``jigsaw.enable=true`` every stage runs under a lease from the group's live scheduler
(:class:`~jigsaw_verl.mux.lease_client.StageLeases`): rollout from ``on_step_begin`` (before verl submits the
prompts) to ``on_sample_end`` (after the replicas sleep), log-prob (reward, old/ref log-prob, values, advantage)
until ``_compute_advantage`` returns, update (critic and actor, checkpoint) until ``on_step_end``, then the weight
sync; the pipeline leaves the group when ``fit`` returns or raises. Each step logs ``jigsaw/lease_wait_s/<stage>``.
The load balancer is :class:`~jigsaw_verl.rollout.load_balancer.MigratingLoadBalancer`, selected through
verl's ``actor_rollout_ref.rollout.router_config_path`` (``jigsaw_verl.main_ppo`` sets both).
"""

from __future__ import annotations

import asyncio
import time

import ray
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from ..core.graph import LOGPROB, ROLLOUT, UPDATE, WEIGHT_SYNC
from ..rollout.client import MigratingLLMServerClient
from ..rollout.migrator import RolloutMigrator
from ..rollout.tail_monitor import TailMonitor, TailPolicy, freed_replica_seconds

TRAINER_MODE = "jigsaw"


@register_trainer(TRAINER_MODE)
class JigsawPPOTrainerV1(PPOTrainerSync):
    """verl's sync PPO trainer with rollout tail migration (``jigsaw.migration.*``), stage leases
    (``jigsaw.enable``) and a canonical batch order (see the module docstring and ``_balance_batch``)."""

    def _migration_config(self):
        return self.config.get("jigsaw", {}).get("migration", {})

    # ---- stage leases (jigsaw.enable=true) ------------------------------------------------------------------
    def _leases(self):
        if getattr(self, "_jigsaw_leases", None) is None and self.config.get("jigsaw", {}).get("enable", False):
            from ..mux.lease_client import StageLeases

            self._jigsaw_leases = StageLeases(self.config)
        return getattr(self, "_jigsaw_leases", None)

    def _stage(self, stage: str) -> None:
        leases = self._leases()
        if leases is not None:
            leases.begin(self.global_steps - 1, stage)

    def fit(self, agent_loop_manager):
        self._leases()  # join before the first step
        try:
            return super().fit(agent_loop_manager)
        finally:
            if getattr(self, "_jigsaw_leases", None) is not None:
                self._jigsaw_leases.leave()

    def on_step_begin(self):
        super().on_step_begin()
        self._stage(ROLLOUT)

    def _balance_batch(self, batch, metrics, logging_prefix="global_seqlen", keep_minibatch=False):
        """Put the step's samples in a canonical order (by prompt tokens, then sample index) before verl balances
        them over the data-parallel ranks. verl orders them by when each response finished, which varies from
        run to run (and with what else runs on the pool); training would then sum the same gradients in another
        order. With this, a step's update depends only on its samples."""
        import transfer_queue as tq

        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["prompts"])
        prompts = data["prompts"].to_padded_tensor(padding=-1).tolist()

        def key(i: int):
            parts = batch.keys[i].rsplit("_", 2)
            sample = (int(parts[1]), int(parts[2])) if len(parts) == 3 and parts[1].isdigit() else (0, 0)
            return (prompts[i], sample, batch.keys[i])

        batch.reorder(sorted(range(len(batch.keys)), key=key))
        return super()._balance_batch(batch, metrics, logging_prefix=logging_prefix, keep_minibatch=keep_minibatch)

    def _compute_advantage(self, batch, metrics):
        batch = super()._compute_advantage(batch, metrics)
        self._stage(UPDATE)
        return batch

    def get_llm_client(self):
        return self.llm_server_manager.get_client(client_cls=MigratingLLMServerClient)

    def _migrator(self) -> RolloutMigrator:
        if getattr(self, "_jigsaw_migrator", None) is None:
            manager = self.llm_server_manager
            servers = dict(zip(manager.server_addresses, manager.server_handles, strict=True))
            self._jigsaw_migrator = RolloutMigrator(manager.global_load_balancer, servers)
        return self._jigsaw_migrator

    def on_sample_begin(self):
        super().on_sample_begin()
        cfg = self._migration_config()
        self._jigsaw_reports_before = len(self._migrator().reports)
        self._jigsaw_counters_before = ray.get(self._migrator().lb.migration_counters.remote())
        self._jigsaw_monitor = None
        if cfg.get("enable", False):
            policy = TailPolicy(tail_threshold=int(cfg.get("tail_threshold", 4)), poll_s=float(cfg.get("poll_s", 0.2)))
            self._jigsaw_monitor = TailMonitor(self._migrator(), policy)
            self._jigsaw_monitor.start()

    def on_sample_end(self):
        migrator = self._migrator()
        if self._jigsaw_monitor is not None:
            self._jigsaw_monitor.stop()
        new = migrator.reports[self._jigsaw_reports_before :]
        counters = ray.get(migrator.lb.migration_counters.remote())
        self._jigsaw_step_metrics = {
            "jigsaw/migrations": len(new),
            "jigsaw/migrated_requests": sum(r.migrated_requests for r in new),
            # counted by the balancer as the moved requests resume: the context each target re-prefilled
            "jigsaw/reprefill_tokens": counters["context_tokens"] - self._jigsaw_counters_before["context_tokens"],
            "jigsaw/freed_replica_s": freed_replica_seconds(new, time.monotonic()),
        }
        parked = [s for r in new if r.freed for s in r.sources]
        if parked:
            asyncio.run(migrator.restore(parked))
        super().on_sample_end()
        self._stage(LOGPROB)

    def on_step_end(self):
        self._stage(WEIGHT_SYNC)
        super().on_step_end()
        leases = self._leases()
        lease_metrics = {}
        if leases is not None:
            leases.end()
            lease_metrics = leases.take_metrics()
        pending = getattr(self, "_pending_sync_metrics", None) or {}
        self._pending_sync_metrics = {**pending, **getattr(self, "_jigsaw_step_metrics", {}), **lease_metrics}
