"""Count the platform's own Ray resource when checking that a resource pool fits the cluster.

What: ``ResourcePoolManager._check_resource_available`` (verl/single_controller/ray/base.py) sums the cluster's
``GPU`` (or ``NPU``) resources. This patch makes it sum ``get_platform().ray_resource_name()`` instead, which is
``GPU`` on NVIDIA, ``NPU`` on Ascend and ``CPU`` on the CPU platform, with the same error otherwise.

Why: with the CPU platform a pool is made of CPU slots (the placement-group bundles already use the platform's
resource name), but the check counted GPUs and failed with "Total available GPUs 0". The trainer builds the
manager inside ``_init_resource_pool_mgr``, so there is no class to substitute without copying that method.
"""

from __future__ import annotations

VERL_VERSIONS = ("0.9.1",)
_MARK = "_jigsaw_platform_resource_check"


def _check_resource_available(self) -> None:
    import ray
    from verl.plugin.platform import get_platform

    resource = get_platform().ray_resource_name()
    available = sum(info.get(resource, 0) for info in ray._private.state.available_resources_per_node().values())
    required = sum(n for process_on_nodes in self.resource_pool_spec.values() for n in process_on_nodes)
    if available < required:
        raise ValueError(f"Total available {resource}s {available} is less than total desired {resource}s {required}")


def is_applied() -> bool:
    from verl.single_controller.ray.base import ResourcePoolManager

    return getattr(ResourcePoolManager._check_resource_available, _MARK, False)


def apply() -> None:
    from verl.single_controller.ray.base import ResourcePoolManager

    setattr(_check_resource_available, _MARK, True)
    ResourcePoolManager._check_resource_available = _check_resource_available
