"""verl V1 trainer mode ``jigsaw``: verl's synchronous trainer plus rollout tail migration and stage leases.

Built on ``verl/trainer/ppo/v1/trainer_sync.py`` (``PPOTrainerSync``) through verl's ``@register_trainer``: it
uses the hooks verl gives a trainer mode and copies none of its methods.
- ``get_llm_client``: verl's resuming client that also survives a dead replica;
- ``on_sample_begin`` / ``on_sample_end``: run the tail monitor while the batch generates (in a group it also
  reports the replicas to the scheduler and runs the migrations its policy orders), then put every migrated-from
  replica back into routing before verl sleeps the replicas and syncs weights;
- ``on_step_end``: log per step ``jigsaw/migrations``, ``jigsaw/migrated_requests``,
  ``jigsaw/reprefill_tokens`` and ``jigsaw/freed_replica_s`` through verl's logger.
With ``jigsaw.enable=true`` the pipeline joins its group while verl sets up its resource pools, and places its
worker groups in the group's shared pool (``_init_resource_pool_mgr``:
:class:`~jigsaw_verl.integration.shared_pool.SharedPoolManager`); when the workers exist (``on_init_end``) it reports
where they went and hands them to a :class:`~jigsaw_verl.integration.residency.LeaseResidency`
(``jigsaw.mux.offload``), which moves the training state on and off the devices with each lease. Every stage then runs
under a lease from the group's live scheduler (:class:`~jigsaw_verl.integration.lease_client.StageLeases`), and the
rollout engines are awake inside leases only (they hold their whole ``gpu_memory_utilization`` reservation then):
start-up from joining to ``on_train_begin`` (a lease outside the step graph, alone on the pipeline's slots, that
also covers the agent-loop workers verl starts after ``init()``; verl sleeps the replicas at the end of ``init()``
and the first sync is the first rollout's); from ``on_step_begin`` the previous
step's weight sync (verl's ``update_weights``, which wakes the replicas), whose lease hands over at once to the
rollout until ``on_sample_end`` (after verl sleeps the replicas; it reports when each response finished); log-prob
(reward, old/ref log-prob, values, advantage) until ``_compute_advantage`` returns; update (critic and actor,
checkpoint) until ``on_step_end``; each validation (``on_validate_begin`` to ``on_validate_end``) under a lease
of its own with its own sync, the replicas put to sleep at its end. The pipeline leaves the group when ``fit``
returns (finished) or raises (failed: a node lost meanwhile is still named as the cause). In a group verl's replay
buffer looks for the step's finished samples every ``jigsaw.mux.sample_poll_s`` (``_build_replay_buffer``), not
every 2 s. Each step logs
``jigsaw/lease_wait_s/<stage>`` and the residency's ``jigsaw/onload_s`` / ``jigsaw/offload_s``. The load balancer is
:class:`~jigsaw_verl.integration.rollout.load_balancer.MigratingLoadBalancer`, selected through verl's
``actor_rollout_ref.rollout.router_config_path`` (``jigsaw_verl.main_ppo`` sets both).
"""

from __future__ import annotations

import asyncio
import time
from functools import cached_property

import ray
import torch
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from jigsaw_verl.integration.rollout.client import MigratingLLMServerClient
from jigsaw_verl.integration.rollout.migrator import RolloutMigrator
from jigsaw_verl.integration.rollout.tail_monitor import TailMonitor, TailPolicy, freed_replica_seconds
from jigsaw_verl.integration.settings import JigsawSettings
from jigsaw_verl.integration.trainer.canonical_order import canonical_order
from jigsaw_verl.model.graph import INIT, LOGPROB, ROLLOUT, UPDATE, VALIDATE, WEIGHT_SYNC

TRAINER_MODE = "jigsaw"


@register_trainer(TRAINER_MODE)
class JigsawPPOTrainerV1(PPOTrainerSync):
    """verl's sync PPO trainer with rollout tail migration (``jigsaw.migration.*``), stage leases
    (``jigsaw.enable``) and a canonical batch order (see the module docstring and ``_balance_batch``)."""

    @cached_property
    def jigsaw_settings(self) -> JigsawSettings:
        """The run's ``jigsaw`` group, parsed once (a config without it: the packaged YAML's defaults)."""
        return JigsawSettings.from_config(self.config)

    # ---- stage leases (jigsaw.enable=true) ------------------------------------------------------------------
    def _leases(self):
        if getattr(self, "_jigsaw_leases", None) is None and self.jigsaw_settings.enable:
            from jigsaw_verl.integration.lease_client import StageLeases

            # verl's own step count (set in _init_dataloader, which runs before the resource pools)
            self._jigsaw_leases = StageLeases(self.jigsaw_settings.mux, self.config, steps=self.total_training_steps)
        return getattr(self, "_jigsaw_leases", None)

    def _stage(self, stage: str) -> None:
        leases = self._leases()
        if leases is not None:
            leases.begin(self.global_steps - 1, stage)

    def _init_resource_pool_mgr(self):
        super()._init_resource_pool_mgr()
        leases = self._leases()  # joins the group: a pipeline the pool cannot hold stops here, before any worker
        if leases is not None:
            from verl.utils.device import get_resource_name

            from jigsaw_verl.integration.shared_pool import SharedPoolManager

            manager = self.resource_pool_manager
            self.resource_pool_manager = SharedPoolManager(
                manager.resource_pool_spec, manager.mapping, leases.pool(get_resource_name()), leases.pipeline
            )
            # start-up (FSDP init, the replicas' launch and memory profiling) under a lease of its own, alone on the
            # pipeline's slots: two pipelines' engines never start on one slot at once
            leases.begin(-1, INIT)

    def on_init_end(self):
        leases = self._leases()
        if leases is None:
            super().on_init_end()  # verl's first weight sync
            return
        # in a group the first sync is the head of the first rollout's lease: one here would leave the replicas
        # awake, outside every lease, until then (verl put them to sleep at the end of its set-up)
        leases.report_placement(self.actor_rollout_wg.workers)
        if self.jigsaw_settings.mux.offload:
            from jigsaw_verl.integration.residency import LeaseResidency

            groups = [self.actor_rollout_wg, getattr(self, "critic_wg", None)]
            leases.residency = LeaseResidency(groups)
            # the pipeline starts with its training state off the devices; its first lease brings it
            leases.residency.offload(UPDATE)

    def on_train_begin(self):
        super().on_train_begin()
        leases = self._leases()
        if leases is not None and leases.current == (-1, INIT):
            # start-up ends here, not at on_init_end: verl starts its agent-loop workers after init() (main_ppo.py,
            # init_agent_loop_manager), processes whose start-up would otherwise run beside other pipelines' stages
            leases.end()

    def _build_replay_buffer(self):
        """verl's replay buffer, checked for the step's finished samples every ``jigsaw.mux.sample_poll_s`` in a
        group (verl polls every 2 s, ``poll_interval`` of ``verl/trainer/ppo/v1/replay_buffer.py``; the rollout's
        lease ends only when a check finds the batch complete)."""
        buffer = super()._build_replay_buffer()
        if self.jigsaw_settings.enable and hasattr(buffer, "poll_interval"):
            buffer.poll_interval = self.jigsaw_settings.mux.sample_poll_s
        return buffer

    def on_validate_begin(self):
        super().on_validate_begin()
        leases = self._leases()
        if leases is not None:
            # validation generates: under a lease of its own, with a weight sync of its own to wake the replicas
            leases.begin(self.global_steps - 1, VALIDATE)
            self._sync_replicas(leases, self.global_steps)

    def on_validate_end(self):
        leases = self._leases()
        if leases is not None:
            self.checkpoint_manager.sleep_replicas()
            leases.end()
        super().on_validate_end()

    def _sync_replicas(self, leases, version: int) -> None:
        """verl's weight sync (it wakes the replicas) with the actor's weights on the devices for it (the sync's
        own lease brings them; any other lease brings them for the sync alone)."""
        moving = leases.residency is not None and leases.current[1] != WEIGHT_SYNC
        if moving:
            leases.residency.onload(WEIGHT_SYNC)
        self.checkpoint_manager.update_weights(version)
        if moving:
            leases.residency.offload(WEIGHT_SYNC)

    def fit(self, agent_loop_manager):
        reason = "finished"
        try:
            return super().fit(agent_loop_manager)
        except BaseException as err:  # e.g. its workers on a lost node died: it leaves as failed, not finished
            reason = f"failed: {type(err).__name__}"
            raise
        finally:
            if getattr(self, "_jigsaw_leases", None) is not None:
                self._jigsaw_leases.leave(reason)

    def on_step_begin(self):
        super().on_step_begin()
        # drain the balancer's finish times every step (in a group only this step's rollout is reported; verl
        # submits the prompts after this hook)
        ray.get(self._migrator().lb.take_finish_times.remote())
        leases = self._leases()
        if leases is not None:
            # the previous step's weight sync (step -1: the first one, outside the step graph) wakes the replicas;
            # its lease hands over to this rollout at once, so they are awake inside leases only
            leases.begin(self.global_steps - 2, WEIGHT_SYNC)
            self._sync_replicas(leases, self.global_steps - 1)
            leases.handover(self.global_steps - 1, ROLLOUT)

    def _balance_batch(self, batch, metrics, logging_prefix="global_seqlen", keep_minibatch=False):
        """Put the step's samples in a canonical order (:mod:`.canonical_order`: by prompt, group content,
        response) before verl balances them over the data-parallel ranks, so a step's update depends only on its
        samples' content, not on when each response finished."""
        import transfer_queue as tq

        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["prompts", "responses"])
        prompts = data["prompts"].to_padded_tensor(padding=-1).tolist()
        responses = data["responses"].to_padded_tensor(padding=-1).tolist()
        batch.reorder(canonical_order(list(batch.keys), prompts, responses))
        return super()._balance_batch(batch, metrics, logging_prefix=logging_prefix, keep_minibatch=keep_minibatch)

    def _fetch_one_gen_batch(self):
        """verl's chunk of prompts; under ``rollout.full_determinism`` each prompt gets its own ``priority`` (its
        position among the prompts this run fetched), which verl's single-turn agent loop turns into the request
        id ``det-<priority>`` (``verl/experimental/agent_loop/single_turn_agent_loop.py``). verl leaves it 0, so
        every request of a step is ``det-0``: the router sends them all to one replica, and a server that seeds
        by request id can only tell a prompt's samples apart by arrival order (the same prompt text drawn twice
        then swaps samples between its two groups). With a per-prompt id the ``n`` samples of one prompt stay
        together and the prompts spread over the replicas."""
        batch = super()._fetch_one_gen_batch()
        if self.config.actor_rollout_ref.rollout.get("full_determinism", False) and "priority" not in batch.keys():
            start = getattr(self, "_jigsaw_prompts_fetched", 0)
            self._jigsaw_prompts_fetched = start + len(batch)
            batch["priority"] = torch.arange(start, start + len(batch), dtype=torch.int64)
        return batch

    def _compute_advantage(self, batch, metrics):
        batch = super()._compute_advantage(batch, metrics)
        self._stage(UPDATE)
        return batch

    def get_llm_client(self):
        return self.llm_server_manager.get_client(client_cls=MigratingLLMServerClient)

    def _migrator(self) -> RolloutMigrator:
        if getattr(self, "_jigsaw_migrator", None) is None:
            manager = self.llm_server_manager
            # verl's replica objects, keyed by the addresses the balancer routes by (LLMServerManager, llm_server.py)
            replicas = {replica.server_address: replica for replica in manager.get_replicas()}
            self._jigsaw_migrator = RolloutMigrator(manager.global_load_balancer, replicas)
        return self._jigsaw_migrator

    def on_sample_begin(self):
        super().on_sample_begin()
        migration = self.jigsaw_settings.migration
        migrator = self._migrator()
        self._jigsaw_reports_before = len(migrator.reports)
        self._jigsaw_counters_before = ray.get(migrator.lb.migration_counters.remote())
        self._jigsaw_monitor = None
        policy = TailPolicy(tail_threshold=migration.tail_threshold) if migration.enable else None
        leases = self._leases()
        if policy is not None or leases is not None:
            # in a group the monitor reports the replicas to the scheduler and runs the migrations it orders
            addresses = list(self.llm_server_manager.server_addresses)
            self._jigsaw_monitor = TailMonitor(
                migrator, policy, group=leases, addresses=addresses, poll_s=migration.poll_s
            )
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
        self._return_migrated_replicas(new)
        super().on_sample_end()
        leases = self._leases()
        if leases is not None:
            # the rollout's live-batch curve (when each response finished) goes to the group's predictor
            leases.end(ray.get(migrator.lb.take_finish_times.remote()))
        self._stage(LOGPROB)

    def _return_migrated_replicas(self, reports) -> None:
        """Put the replicas this rollout's migrations freed (``reports``) back into routing, still asleep: verl
        sleeps every replica now and its next weight sync wakes them, so waking one here would only take its full
        memory on a slot that may already be granted to another pipeline. With ``free_cache_engine=false`` verl
        never sleeps or wakes its replicas, so the migrator's sleep is undone here."""
        parked = [s for r in reports if r.freed for s in r.sources]
        if parked:
            wake = not self.config.actor_rollout_ref.rollout.get("free_cache_engine", True)
            asyncio.run(self._migrator().restore(parked, wake=wake))

    def on_step_end(self):
        leases = self._leases()
        lease_metrics = {}
        if leases is None:
            super().on_step_end()  # verl's weight sync
        else:
            leases.end()  # the update; in a group the sync is the head of the next rollout (none after the last)
            lease_metrics = leases.take_metrics()
        pending = getattr(self, "_pending_sync_metrics", None) or {}
        self._pending_sync_metrics = {**pending, **getattr(self, "_jigsaw_step_metrics", {}), **lease_metrics}
