"""Give each verl run its own TransferQueue when several runs share one Ray cluster.

What: when ``JIGSAW_VERL_TQ_NAMESPACE`` is set, TransferQueue's named actors (``TransferQueueController``,
``RayObjectRefStorage``) are created and looked up in that Ray namespace instead of the fixed ``transfer_queue``
namespace, by giving ``transfer_queue.interface`` (and the Ray storage client) a ``ray`` whose ``get_actor`` and a
controller class whose ``options`` map ``namespace="transfer_queue"`` to it. Nothing else changes.

Why: TransferQueue 0.1.11 (verl's V1 trainer data plane) names its controller in a fixed namespace, so every verl
run in one Ray cluster finds the first run's controller: the runs share partitions (``train``) and the first run
to finish kills the controller under the others (``tq.close()``), which then hang. Multiplexed pipelines share a
Ray cluster by design; ``jigsaw_verl.main_ppo`` sets the variable (per group and pipeline) for the driver and,
through the job's runtime env, for every worker. TransferQueue has no setting for it.
"""

from __future__ import annotations

import os

TQ_VERSIONS = ("0.1.11",)
ENV = "JIGSAW_VERL_TQ_NAMESPACE"
FIXED = "transfer_queue"


class _RayWithNamespace:
    """The ``ray`` module, except that ``get_actor(..., namespace="transfer_queue")`` looks in ``namespace``."""

    def __init__(self, ray_module, namespace: str):
        self._ray, self._namespace = ray_module, namespace

    def get_actor(self, name, namespace=None):
        return self._ray.get_actor(name, namespace=self._namespace if namespace == FIXED else namespace)

    def __getattr__(self, attr):
        return getattr(self._ray, attr)


class _ActorClassWithNamespace:
    """A Ray actor class whose ``options(namespace="transfer_queue")`` creates the actor in ``namespace``."""

    def __init__(self, actor_class, namespace: str):
        self._cls, self._namespace = actor_class, namespace

    def options(self, **kwargs):
        if kwargs.get("namespace") == FIXED:
            kwargs["namespace"] = self._namespace
        return self._cls.options(**kwargs)

    def __getattr__(self, attr):
        return getattr(self._cls, attr)


def installed_version() -> str:
    from importlib.metadata import version

    return version("TransferQueue")


def check_tq_version(patch: str) -> None:
    """Refuse to patch a TransferQueue release the patch ``jigsaw_verl.patches.<patch>`` was not written for."""
    found = installed_version()
    if found not in TQ_VERSIONS:
        raise RuntimeError(
            f"jigsaw_verl.patches.{patch} was written for TransferQueue {', '.join(TQ_VERSIONS)}; installed is "
            f"{found}. Re-check it against this release before widening TQ_VERSIONS."
        )


def is_applied() -> bool:
    import transfer_queue.interface as tqi

    return isinstance(tqi.ray, _RayWithNamespace)


def apply() -> None:
    namespace = os.environ.get(ENV)
    if not namespace:
        raise RuntimeError(f"{ENV} is not set: nothing to apply")
    check_tq_version("transfer_queue_namespace")
    import transfer_queue.interface as tqi
    from transfer_queue.storage.clients import ray_storage_client

    tqi.ray = _RayWithNamespace(tqi.ray, namespace)
    tqi.TransferQueueController = _ActorClassWithNamespace(tqi.TransferQueueController, namespace)
    ray_storage_client.ray = _RayWithNamespace(ray_storage_client.ray, namespace)
    ray_storage_client.RayObjectRefStorage = _ActorClassWithNamespace(ray_storage_client.RayObjectRefStorage, namespace)
