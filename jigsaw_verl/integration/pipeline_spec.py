"""A verl run's config as the :class:`~jigsaw_verl.model.spec.PipelineSpec` the scheduler plans with.

The policy needs a prior for each pipeline's stages before any step ran; its predictor then corrects it from the
stage times the pipeline reports (the snapshot's history). The prior comes from what the verl config says: the
model's ``config.json`` (from a local folder or the local Hugging Face cache, :mod:`.model_lookup`: exact
parameter count, layers, heads), prompts per step, responses per prompt, the length caps (a response median of half
the cap, p99 at the cap: the predictor replaces them with what it sees), rollout TP, steps, whether there is a
reference model or a critic.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from jigsaw_verl.integration.model_lookup import find_model_config
from jigsaw_verl.model.catalogue import GPUSpec, model_from_hf_config
from jigsaw_verl.model.engine_memory import EngineReservation
from jigsaw_verl.model.memory import train_state_bytes
from jigsaw_verl.model.slots import sized_slot, slot_spec
from jigsaw_verl.model.spec import LengthDist, PipelineSpec
from jigsaw_verl.model.topology import PoolTopology

# verl's RolloutConfig.gpu_memory_utilization default (verl/workers/config/rollout.py), for a config without the key
VERL_ENGINE_FRACTION = 0.5

if TYPE_CHECKING:
    from jigsaw_verl.integration.settings import MuxSettings


def _get(config, dotted: str, default=None):
    node = config
    for part in dotted.split("."):
        if node is None or not hasattr(node, "get"):
            return default
        node = node.get(part)
    return default if node is None else node


def mux_pipeline_name(mux: MuxSettings, config) -> str:
    """The pipeline's name in its group: ``jigsaw.mux.pipeline``, else ``trainer.experiment_name`` of ``config``."""
    return str(mux.pipeline or _get(config, "trainer.experiment_name"))


def mux_slots(mux: MuxSettings, config) -> int:
    """The pool slots the pipeline's stages lease: ``jigsaw.mux.slots``, else the GPUs verl gives the run
    (``trainer.n_gpus_per_node * trainer.nnodes`` of ``config``)."""
    if mux.slots is not None:
        return mux.slots
    return int(_get(config, "trainer.n_gpus_per_node")) * int(_get(config, "trainer.nnodes"))


def mux_pool_slots(mux: MuxSettings, config) -> int:
    """The slots of the group's pool when this pipeline creates it: ``jigsaw.mux.pool_slots``, else its own."""
    return mux.pool_slots if mux.pool_slots is not None else mux_slots(mux, config)


def mux_pool_nodes(mux: MuxSettings, config) -> int:
    """The nodes of the group's pool when this pipeline creates it: ``jigsaw.mux.pool_nodes``, else
    ``trainer.nnodes`` for a pool of the pipeline's own slots, else one."""
    if mux.pool_nodes is not None:
        return mux.pool_nodes
    return int(_get(config, "trainer.nnodes")) if mux.pool_slots is None else 1


def mux_pool_topology(mux: MuxSettings, config) -> PoolTopology:
    """The shape of the group's pool when this pipeline creates it (``ValueError`` when the slots do not cut into
    its nodes)."""
    slots, nodes = mux_pool_slots(mux, config), mux_pool_nodes(mux, config)
    if slots % nodes:
        raise ValueError(f"a pool of {slots} slots cannot be cut into {nodes} equal nodes")
    return PoolTopology(slots, slots // nodes)


def pipeline_spec_from_verl(name: str, config, *, steps: int | None = None) -> PipelineSpec:
    """The planning spec of a verl run (``config`` is verl's resolved DictConfig, or a nested dict); ``steps``: the
    count the trainer computed (verl's rule), else ``trainer.total_training_steps``."""
    found = find_model_config(str(_get(config, "actor_rollout_ref.model.path")))
    model = model_from_hf_config(found.config, name=found.name)
    prompt_cap = int(_get(config, "data.max_prompt_length", 512))
    response_cap = int(_get(config, "data.max_response_length", 512))
    steps = steps if steps is not None else _get(config, "trainer.total_training_steps")
    if steps is None:
        raise ValueError("trainer.total_training_steps: unknown here; pass the trainer's step count")
    algorithm = "ppo" if str(_get(config, "algorithm.adv_estimator", "grpo")) == "gae" else "grpo"
    return PipelineSpec(
        name=name,
        model=model,
        algorithm=algorithm,
        batch_prompts=int(_get(config, "data.train_batch_size")),
        group_size=int(_get(config, "actor_rollout_ref.rollout.n", 1)),
        prompt_len=LengthDist(median=max(1.0, prompt_cap / 2), p99=float(prompt_cap), max=prompt_cap),
        response_len=LengthDist(median=max(1.0, response_cap / 2), p99=float(response_cap), max=response_cap),
        ref_model=bool(_get(config, "actor_rollout_ref.actor.use_kl_loss", False))
        or bool(_get(config, "algorithm.use_kl_in_reward", False)),
        rollout_tp=int(_get(config, "actor_rollout_ref.rollout.tensor_model_parallel_size", 1)),
        steps=int(steps),
    )


def mux_slot_spec(mux: MuxSettings, config, spec: PipelineSpec) -> GPUSpec:
    """The slot hardware the group plans with, its memory sized (``jigsaw.mux.slot_memory_mib``, else the GPU's; on
    the CPU scaled to ``spec``'s model, :func:`~jigsaw_verl.model.slots.sized_slot`)."""
    device = str(_get(config, "trainer.device", "cuda"))
    return sized_slot(slot_spec(device, mux.gpu), device, spec.model, mux.slot_memory_mib, mux.gpu)


def engine_reservation_from_verl(mux: MuxSettings, config, spec: PipelineSpec) -> EngineReservation:
    """What the pipeline's rollout engine reserves (``actor_rollout_ref.rollout.gpu_memory_utilization``) and what
    it keeps on each of its slots outside every lease: the training state when ``jigsaw.mux.offload`` is off. The
    reference model keeps nothing there: verl's FSDP engines always give a forward-only model CPU offload (FSDP1
    ``CPUOffload(offload_params=True)``, FSDP2 ``CPUOffloadPolicy``: ``verl/workers/engine/fsdp/transformer_impl.py``,
    ``_build_fsdp_module``), so its weights reach the device only while its log-probs are computed, in a lease."""
    slots = mux_slots(mux, config)
    pinned = 0.0 if mux.offload else train_state_bytes(spec.model, critic=spec.critic, ref_model=False) / slots
    return EngineReservation(
        pipeline=spec.name,
        slots=slots,
        fraction=float(_get(config, "actor_rollout_ref.rollout.gpu_memory_utilization", VERL_ENGINE_FRACTION)),
        pinned_bytes=pinned,
    )
