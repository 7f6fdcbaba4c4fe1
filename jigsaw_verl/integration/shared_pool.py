"""The group's pool as Ray placement groups: one per node (as verl makes its own), owned by the group's scheduler,
into which every joined pipeline's worker groups are placed.

Built on ``verl/single_controller/ray/base.py``: verl's trainer makes its placement groups through
``ResourcePoolManager.create_resource_pool`` and ``RayResourcePool.get_placement_groups``, which returns the
pool's ``pgs`` when they are already set. :class:`SharedPoolManager` makes verl's ``SubRayResourcePool`` over the
group's placement groups, so ``RayWorkerGroup`` places rank ``r`` in slot ``first_slot + r`` of the shared pool
(the pipeline's home, which the scheduler picks to spread pipelines and keep each rollout replica on one node;
slot ``g`` is bundle ``g % slots_per_node`` of node ``g // slots_per_node``); nothing else of verl changes.

Each bundle is a slot, shaped as verl shapes its own (``{"CPU": colocate, <device>: 1}``). verl gives each
colocated worker ``1 / max_colocate_count`` of a bundle's device; here ``max_colocate_count`` is verl's default
(3) times the most pipelines the group holds, so every joined pipeline's workers fit into the same bundles at
once. Who computes when is the scheduler's business (stage leases); the placement only says where state lives.
"""

from __future__ import annotations

from verl.single_controller.ray.base import ResourcePoolManager, SubRayResourcePool

from jigsaw_verl.runtime.pool_placement import PoolPlacement

GLOBAL_POOL = "global_pool"


class SharedResourcePool(SubRayResourcePool):
    """verl's ``SubRayResourcePool`` over the group's pool: ``world_size`` ranks from slot ``first_slot`` on, across
    the pool's per-node placement groups (verl's node-major numbering: rank ``r`` in group
    ``(first_slot + r) // slots_per_node``), with ``RAY_LOCAL_WORLD_SIZE`` the pool's slots per node, as a
    multi-node verl run on such nodes gets."""

    def __init__(self, world_size: int, placement: PoolPlacement, name_prefix: str):
        super().__init__(
            placement_groups=list(placement.placement_groups),
            start_bundle_index=placement.first_slot,
            subgroup_world_size=world_size,
            process_on_nodes=[placement.slots_per_node] * len(placement.placement_groups),
            use_gpu=True,
            max_colocate_count=placement.max_colocate_count,
            name_prefix=name_prefix,
        )


class SharedPoolManager(ResourcePoolManager):
    """verl's ``ResourcePoolManager`` that places the pipeline's ``global_pool`` in the group's shared pool.

    Args:
        resource_pool_spec: verl's spec (``{"global_pool": [n_gpus_per_node] * nnodes}``).
        mapping: verl's role -> pool mapping.
        placement: the group's pool.
        pipeline: the pipeline's name, for errors and worker names.
    """

    def __init__(self, resource_pool_spec: dict, mapping: dict, placement: PoolPlacement, pipeline: str):
        super().__init__(resource_pool_spec=resource_pool_spec, mapping=mapping)
        self.placement = placement
        self.pipeline = pipeline

    def create_resource_pool(self):
        self._check_resource_available()  # before anything is made (verl's own checks after)
        for name, process_on_nodes in self.resource_pool_spec.items():
            self.resource_pool_dict[name] = SharedResourcePool(
                sum(process_on_nodes), self.placement, name_prefix=f"{self.pipeline}_{name}_"
            )

    def _check_resource_available(self):
        # verl's counts the cluster's free GPUs, which the pool's placement group already holds
        check_shareable(self.resource_pool_spec, self.placement, self.pipeline)


def check_shareable(resource_pool_spec: dict, placement: PoolPlacement, pipeline: str) -> None:
    """Raise ``ValueError`` naming the setting when a pipeline's resource pools cannot go into the group's pool."""
    extra = sorted(set(resource_pool_spec) - {GLOBAL_POOL})
    if extra:
        raise ValueError(
            f"jigsaw.mux: pipeline {pipeline!r} asks for separate resource pools {extra} "
            "(reward.reward_model.enable_resource_pool / distillation); a multiplexed pipeline runs all its roles in "
            "the group's pool"
        )
    nodes = resource_pool_spec[GLOBAL_POOL]
    if placement.first_slot + sum(nodes) > placement.num_slots:
        raise ValueError(
            f"trainer.n_gpus_per_node={nodes[0]} x trainer.nnodes={len(nodes)}: pipeline {pipeline!r} needs more "
            f"slots than the group's pool has from slot {placement.first_slot} ({placement.num_slots} in all)"
        )
