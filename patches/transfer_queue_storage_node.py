"""Keep a multiplexed pipeline's TransferQueue storage on its own trainer's node.

What: in a pipeline of a multiplexing group (``JIGSAW_VERL_TQ_NAMESPACE`` set), TransferQueue's SimpleStorage
bootstrap places every storage unit on the node of the process that starts TransferQueue (verl's trainer, the
``TaskRunner``), with a hard node affinity, instead of round-robin over every alive Ray node
(``get_node_round_robin_scheduling_strategies`` of ``transfer_queue/utils/common.py``, as
``transfer_queue/storage/bootstrap/simple_storage_bootstrap.py`` imports it). When the run sets
``transfer_queue.backend.SimpleStorage.required_node_resource`` TransferQueue's own choice stands.

Why: a group's Ray nodes are shared. Round-robin puts a pipeline's experience data on nodes where only other
pipelines' workers live, so a node that dies (and ends the pipelines placed there) would also take this pipeline's
storage and end it too. Beside its trainer, a pipeline's data depends on the nodes it uses and no others.
TransferQueue has no setting for "the caller's node".
"""

from __future__ import annotations

import os

# the same multiplexed runs and TransferQueue releases as the namespace patch
from jigsaw_verl.patches.transfer_queue_namespace import ENV, TQ_VERSIONS, check_tq_version  # noqa: F401


def _on_this_node(original):
    def strategies(num_actors: int, required_node_resource: str | None = None):
        if required_node_resource is not None:
            return original(num_actors, required_node_resource=required_node_resource)
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = ray.get_runtime_context().get_node_id()
        return [NodeAffinitySchedulingStrategy(node_id=here, soft=False) for _ in range(num_actors)]

    strategies.jigsaw_original = original
    return strategies


def is_applied() -> bool:
    from transfer_queue.storage.bootstrap import simple_storage_bootstrap as bootstrap

    return hasattr(bootstrap.get_node_round_robin_scheduling_strategies, "jigsaw_original")


def apply() -> None:
    if not os.environ.get(ENV):
        raise RuntimeError(f"{ENV} is not set: not a multiplexed run, nothing to apply")
    check_tq_version("transfer_queue_storage_node")
    from transfer_queue.storage.bootstrap import simple_storage_bootstrap as bootstrap

    if not is_applied():
        bootstrap.get_node_round_robin_scheduling_strategies = _on_this_node(
            bootstrap.get_node_round_robin_scheduling_strategies
        )
