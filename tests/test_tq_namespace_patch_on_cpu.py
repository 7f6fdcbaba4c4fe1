"""patches/transfer_queue_namespace.py: each multiplexed run gets its own TransferQueue actors in a shared Ray
cluster (tested on real Ray actors and on TransferQueue's real module objects, which the test restores)."""

from __future__ import annotations

import pytest


def test_named_actors_go_to_the_run_namespace(ray_session, monkeypatch):
    import transfer_queue.interface as tqi
    from transfer_queue.storage.clients import ray_storage_client

    from jigsaw_verl.patches import transfer_queue_namespace as patch

    saved = (tqi.ray, tqi.TransferQueueController, ray_storage_client.ray, ray_storage_client.RayObjectRefStorage)
    monkeypatch.setenv(patch.ENV, "transfer_queue.g.p0")
    try:
        assert not patch.is_applied()
        patch.apply()
        assert patch.is_applied()

        @ray_session.remote
        class Named:
            def ping(self):
                return "pong"

        cls = patch._ActorClassWithNamespace(Named, "transfer_queue.g.p0")
        actor = cls.options(name="TransferQueueController", namespace="transfer_queue").remote()
        # TransferQueue's own lookup (patched) finds it; the fixed namespace does not hold it
        found = tqi.ray.get_actor("TransferQueueController", namespace="transfer_queue")
        assert ray_session.get(found.ping.remote()) == "pong"
        with pytest.raises(ValueError):
            ray_session.get_actor("TransferQueueController", namespace="transfer_queue")
        assert ray_session.get_actor("TransferQueueController", namespace="transfer_queue.g.p0") is not None
        # everything else is the real ray module and the real controller class
        assert tqi.ray.get is ray_session.get and tqi.TransferQueueController._cls is saved[1]
        ray_session.kill(actor)
    finally:
        tqi.ray, tqi.TransferQueueController, ray_storage_client.ray, ray_storage_client.RayObjectRefStorage = saved


def test_refuses_without_a_namespace_or_on_another_release(monkeypatch):
    from jigsaw_verl.patches import transfer_queue_namespace as patch

    monkeypatch.delenv(patch.ENV, raising=False)
    with pytest.raises(RuntimeError, match="JIGSAW_VERL_TQ_NAMESPACE is not set"):
        patch.apply()
    monkeypatch.setenv(patch.ENV, "x")
    monkeypatch.setattr(patch, "installed_version", lambda: "9.9.9")
    with pytest.raises(RuntimeError, match="written for TransferQueue 0.1.11; installed is 9.9.9"):
        patch.apply()
