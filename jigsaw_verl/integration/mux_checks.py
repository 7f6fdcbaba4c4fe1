"""The checks of a multiplexed run (``jigsaw.enable=true``) against verl's own keys, before Ray.

Each check is a function of the run's ``jigsaw.mux`` settings and verl config that raises
:class:`~jigsaw_verl.integration.settings.JigsawConfigError` with one line naming the key and what would work.
The entry point stops at the first (:func:`check_mux_run`); ``jigsaw-verl check`` reports every one
(:func:`mux_problems`).
"""

from __future__ import annotations

from collections.abc import Callable

from omegaconf import DictConfig

from jigsaw_verl.integration.model_lookup import find_model_config
from jigsaw_verl.integration.pipeline_spec import (
    VERL_ENGINE_FRACTION,
    engine_reservation_from_verl,
    mux_pipeline_name,
    mux_pool_nodes,
    mux_pool_topology,
    mux_slot_spec,
    mux_slots,
    pipeline_spec_from_verl,
)
from jigsaw_verl.integration.settings import JigsawConfigError, MuxSettings
from jigsaw_verl.integration.step_count import planned_steps
from jigsaw_verl.model.engine_memory import ENGINE_FRACTION_KEY, slot_memory_refusal

# verl's key of the rollout replicas' tensor-parallel size
TP_KEY = "actor_rollout_ref.rollout.tensor_model_parallel_size"

# verl's FSDP engines (model_engine=dp): what the leases and the residency are built and tested on
FSDP_STRATEGIES = ("fsdp", "fsdp2")


def check_mux_policy(policy: str) -> None:
    """Refuse a ``jigsaw.mux.policy`` the registry does not know, or one the live runtime cannot run (the rule is
    :func:`~jigsaw_verl.runtime.live_policy.check_live_policy`, the one the executor applies at join)."""
    from jigsaw_verl.runtime.leases import PolicyRefused
    from jigsaw_verl.runtime.live_policy import check_live_policy

    try:
        check_live_policy(policy)
    except PolicyRefused as err:
        raise JigsawConfigError(str(err)) from None


def _group(mux: MuxSettings, config: DictConfig) -> None:
    if not mux.group:
        raise JigsawConfigError("jigsaw.enable=true needs jigsaw.mux.group: the multiplexing group to join")


def _policy(mux: MuxSettings, config: DictConfig) -> None:
    check_mux_policy(mux.policy)


def _steps(mux: MuxSettings, config: DictConfig) -> None:
    planned_steps(config)  # trainer.total_training_steps, else verl's rule over the data files


def _model(mux: MuxSettings, config: DictConfig) -> None:
    find_model_config(str(config.actor_rollout_ref.model.path))  # the scheduler plans with its config.json


def _slots(mux: MuxSettings, config: DictConfig) -> None:
    slots, pool, name = mux_slots(mux, config), mux.pool_slots, mux_pipeline_name(mux, config)
    if pool is not None and slots > pool:
        raise JigsawConfigError(
            f"jigsaw.mux.slots: pipeline {name!r} needs {slots} slots (trainer.n_gpus_per_node x trainer.nnodes "
            f"unless set) but group {mux.group!r} has a pool of {pool}"
        )
    if pool is not None and int(config.trainer.n_gpus_per_node) * int(config.trainer.nnodes) > pool:
        raise JigsawConfigError(
            f"trainer.n_gpus_per_node={config.trainer.n_gpus_per_node}: pipeline {name!r} "
            f"places more workers than group {mux.group!r} has pool slots ({pool})"
        )


def _nodes(mux: MuxSettings, config: DictConfig) -> None:
    # the group's pool is nodes x slots (integration/shared_pool.py); a rollout replica stays on one of its nodes
    name, nodes = mux_pipeline_name(mux, config), int(config.trainer.nnodes)
    try:
        topology = mux_pool_topology(mux, config)
    except ValueError as err:
        raise JigsawConfigError(f"jigsaw.mux.pool_nodes={mux_pool_nodes(mux, config)}: {err}") from None
    if nodes > topology.nodes:
        raise JigsawConfigError(
            f"trainer.nnodes={nodes}: pipeline {name!r} spans more nodes than the pool of group {mux.group!r} has "
            f"({topology.describe()}; jigsaw.mux.pool_nodes)"
        )
    rollout = config.actor_rollout_ref.rollout
    tp = int(rollout.get("tensor_model_parallel_size", 1))
    if tp < 1 or topology.slots_per_node % tp:
        raise JigsawConfigError(
            f"{TP_KEY}={tp}: the rollout replicas of pipeline {name!r} cannot be placed on the pool of group "
            f"{mux.group!r}, {topology.describe()} (a replica never straddles nodes: the TP must divide the slots "
            "per node)"
        )
    per_node = int(rollout.get("n_gpus_per_node") or config.trainer.n_gpus_per_node)
    if tp > per_node:
        raise JigsawConfigError(
            f"{TP_KEY}={tp}: pipeline {name!r}'s rollout replicas would span verl's nodes of {per_node} "
            f"(actor_rollout_ref.rollout.n_gpus_per_node); in a group a replica stays on one node"
        )


def _reward_model(mux: MuxSettings, config: DictConfig) -> None:
    reward_model = config.reward.get("reward_model", {})
    if reward_model.get("enable_resource_pool", False):
        raise JigsawConfigError(
            "reward.reward_model.enable_resource_pool=true: a multiplexed pipeline runs all its roles in the "
            "group's pool (jigsaw.enable=true)"
        )
    if reward_model.get("enable", False):
        raise JigsawConfigError(
            "reward.reward_model.enable=true: a reward model's servers would hold device memory outside the "
            "pipeline's leases; a multiplexed pipeline takes a rule-based reward (reward.custom_reward_function) "
            "for now"
        )


def _trainer_mode(mux: MuxSettings, config: DictConfig) -> None:
    mode = config.trainer.v1.get("trainer_mode", "sync")
    if mode not in ("sync", "jigsaw") or not config.trainer.get("use_v1", True):
        raise JigsawConfigError(
            f"jigsaw.enable=true runs verl's V1 trainer in mode jigsaw; trainer.v1.trainer_mode={mode!r} "
            f"/ trainer.use_v1={config.trainer.get('use_v1')} is not supported with it"
        )


def _engine(mux: MuxSettings, config: DictConfig) -> None:
    strategy = config.actor_rollout_ref.actor.get("strategy")
    if strategy not in FSDP_STRATEGIES:
        raise JigsawConfigError(
            f"actor_rollout_ref.actor.strategy={strategy!r}: a multiplexed pipeline trains on verl's FSDP engine "
            f"(model_engine=dp, strategy in {list(FSDP_STRATEGIES)}); Megatron and other engines cannot join yet"
        )


def _engine_sleeps(mux: MuxSettings, config: DictConfig) -> None:
    # verl sleeps the replicas after each rollout only with free_cache_engine on; awake they would hold their whole
    # reservation on slots the group's scheduler hands to other pipelines between this pipeline's rollouts
    if not config.actor_rollout_ref.rollout.get("free_cache_engine", True):
        raise JigsawConfigError(
            "actor_rollout_ref.rollout.free_cache_engine=false: a multiplexed pipeline's rollout engines must sleep "
            "between its rollouts (their memory is other pipelines' then); set it true (verl's default)"
        )


def _engine_memory(mux: MuxSettings, config: DictConfig) -> None:
    # the pipeline alone on a slot: its engine's reservation beside what it pins (the group's rule is applied over
    # every pipeline by the launcher and, at join, by the group's executor)
    fraction = config.actor_rollout_ref.rollout.get("gpu_memory_utilization", VERL_ENGINE_FRACTION)
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise JigsawConfigError(f"{ENGINE_FRACTION_KEY}={fraction!r}: a multiplexed pipeline needs a number in (0, 1]")
    spec = pipeline_spec_from_verl(mux_pipeline_name(mux, config), config, steps=planned_steps(config).steps)
    refusal = slot_memory_refusal(
        [engine_reservation_from_verl(mux, config, spec)], mux_slot_spec(mux, config, spec).memory_bytes, 0
    )
    if refusal:
        raise JigsawConfigError(refusal)


MUX_CHECKS: tuple[Callable[[MuxSettings, DictConfig], None], ...] = (
    _group,
    _policy,
    _steps,
    _model,
    _slots,
    _nodes,
    _reward_model,
    _trainer_mode,
    _engine,
    _engine_sleeps,
    _engine_memory,
)


def mux_problems(mux: MuxSettings, config: DictConfig) -> list[str]:
    """One line per check of :data:`MUX_CHECKS` that fails."""
    problems = []
    for check in MUX_CHECKS:
        try:
            check(mux, config)
        except JigsawConfigError as err:
            problems.append(str(err))
    return problems


def check_mux_run(mux: MuxSettings, config: DictConfig) -> None:
    """Raise the first problem of :func:`mux_problems`, if any."""
    for check in MUX_CHECKS:
        check(mux, config)
