"""Device memory of the simulated pool: what each GPU holds resident, eviction, and the KV room it leaves.

Each GPU keeps pipeline state resident (training state sharded over a GPU set, rollout weights per replica) and
evicts the least recently used idle state of another pipeline when it needs room; loading state that is not
resident costs a host-to-device copy at the cost model's PCIe rate, charged before the stage. KV cache gets what
resident state leaves free. State in use (the key of a task holding slots) is pinned.

A decision reads free memory and training homes at every event, on pools of a thousand GPUs: both keep what they
derive from resident state until it or the holds change (``version``, :attr:`SlotHolds.version`); the KV cache
of live sequences, which changes at every event, is summed afresh.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from jigsaw_verl.model.catalogue import GPUSpec, ModelSpec
from jigsaw_verl.model.cost_model import CostModel
from jigsaw_verl.model.memory import kv_capacity_tokens, usable_bytes
from jigsaw_verl.pool.holds import SlotHolds
from jigsaw_verl.sim.tasks import Engine


class OutOfDeviceMemory(RuntimeError):
    """State in use leaves no room on a GPU."""


class DeviceMemory:
    """Resident state per GPU of a pool whose holds are ``holds``.

    Args:
        holds: the pool's holds (their owners are the simulator's tasks).
        gpu: the GPU type.
        cost: the cost model (host copies).
    """

    def __init__(self, holds: SlotHolds, gpu: GPUSpec, cost: CostModel):
        self.holds, self.gpu, self.cost = holds, gpu, cost
        self.n = holds.num_slots
        self.resident: list[OrderedDict] = [OrderedDict() for _ in range(self.n)]
        self.version = 0  # bumped by every change of what is resident where (or of its LRU order)
        self._layout_cache: tuple | None = None  # ((holds version, version), what free memory sums over)
        self._homes_cache: tuple | None = None  # (version, training homes)
        self._pinned_keys: tuple | None = None  # (holds version, keys in use)

    def pinned(self) -> frozenset:
        """Keys of the state that running tasks use (kept until the holds change)."""
        if self._pinned_keys is None or self._pinned_keys[0] != self.holds.version:
            keys = frozenset(h.owner.key for h in self.holds.holds() if h.owner.key is not None)
            self._pinned_keys = (self.holds.version, keys)
        return self._pinned_keys[1]

    def kv_bytes(self, g: int) -> float:
        """KV cache held on GPU ``g`` by live sequences of the replicas there."""
        return sum(
            t.engine.kv_reserved * t.engine.model.kv_bytes_per_token / t.engine.tp
            for t in (h.owner for h in self.holds.on(g))
            if isinstance(t, Engine)
        )

    def free_bytes(self) -> tuple[float, ...]:
        """Per GPU, memory not held by running tasks (idle resident state counts as free: it can be evicted): the
        live sequences' KV cache of the replicas there, then each pinned resident state, added in that order."""
        replicas, slot_of, kv_per_token, tp, pinned = self._layout()
        used = np.zeros(self.n)
        if replicas:
            reserved = np.array([t.engine.kv_reserved for t in replicas], dtype=np.float64)
            np.add.at(used, slot_of[0], (reserved * kv_per_token / tp)[slot_of[1]])
        for layer in pinned:
            used = used + layer
        return tuple((usable_bytes(self.gpu) - used).tolist())

    def _layout(self) -> tuple:
        """What free memory is summed over, kept until the holds or resident state change: the replicas holding
        slots, ``(slots, replica index)`` of every replica slot, each replica's KV bytes per token and TP, and the
        pinned resident state as layers (layer ``i``: per GPU the ``i``-th pinned state's bytes there, or 0)."""
        stamp = (self.holds.version, self.version)
        if self._layout_cache is not None and self._layout_cache[0] == stamp:
            return self._layout_cache[1]
        replicas = [h.owner for h in self.holds.holds() if isinstance(h.owner, Engine)]
        slots = [(g, i) for i, t in enumerate(replicas) for g in t.hold.slots]
        slot_of = (np.array([g for g, _ in slots], dtype=np.int64), np.array([i for _, i in slots], dtype=np.int64))
        kv_per_token = np.array([t.engine.model.kv_bytes_per_token for t in replicas], dtype=np.float64)
        tp = np.array([t.engine.tp for t in replicas], dtype=np.float64)
        keys = self.pinned()
        pinned: list[np.ndarray] = []
        for g, res in enumerate(self.resident):
            for i, b in enumerate(b for k, b in res.items() if k in keys):
                if i == len(pinned):
                    pinned.append(np.zeros(self.n))
                pinned[i][g] = b
        layout = (replicas, slot_of, kv_per_token, tp, pinned)
        self._layout_cache = (stamp, layout)
        return layout

    def train_homes(self) -> dict[str, tuple[int, ...]]:
        """Per pipeline, the GPUs holding its training state (do not mutate: kept until resident state changes)."""
        if self._homes_cache is None or self._homes_cache[0] != self.version:
            out: dict[str, tuple[int, ...]] = {}
            for res in self.resident:
                for k in res:
                    if k[1] == "train":
                        out.setdefault(k[0], k[2])
            self._homes_cache = (self.version, out)
        return self._homes_cache[1]

    def others(self, group: tuple[int, ...], key: tuple) -> float:
        """The most any GPU of ``group`` holds besides ``key``, bytes."""
        return max(sum(b for k, b in self.resident[g].items() if k != key) for g in group)

    def kv_room(
        self, model: ModelSpec, tp: int, group: tuple[int, ...], key: tuple, gpu_memory_utilization: float | None = None
    ) -> int:
        """KV tokens a replica ``key`` on ``group`` can hold beside the rest of what is resident there (and within
        its engine's ``gpu_memory_utilization``)."""
        others = self.others(group, key)
        return kv_capacity_tokens(
            model, self.gpu, tp=tp, other_resident_bytes=others, gpu_memory_utilization=gpu_memory_utilization
        )

    def evict(self, key: tuple) -> None:
        """Drop ``key`` from every GPU that holds it."""
        self.version += 1
        for h in range(self.n):
            self.resident[h].pop(key, None)

    def evict_idle_of_others(self, gpus, pipeline: str) -> None:
        """Idle state of other pipelines on ``gpus`` makes room (a replica joining a gang's GPUs)."""
        pinned = self.pinned()
        for g in gpus:
            for k in [k for k in self.resident[g] if k not in pinned and k[0] != pipeline]:
                self.evict(k)

    def kv_for_replica(
        self,
        model: ModelSpec,
        tp: int,
        group: tuple[int, ...],
        key: tuple,
        longest: int,
        gpu_memory_utilization: float | None = None,
    ) -> int:
        """The KV room of a new replica; when idle state left no room for even one request, evict it (LRU) for a
        few."""
        cap = self.kv_room(model, tp, group, key, gpu_memory_utilization)
        if cap < longest:
            pinned = self.pinned() | {key}
            while cap < 4 * longest:
                victim = next((k for g in group for k in self.resident[g] if k not in pinned), None)
                if victim is None:
                    break
                self.evict(victim)
                cap = self.kv_room(model, tp, group, key, gpu_memory_utilization)
        return cap

    def make_resident(self, gpus: tuple[int, ...], key: tuple, bytes_per_gpu: float) -> float:
        """Make ``key`` resident on ``gpus``; return the seconds of host copies it costs (0 if already there)."""
        self.version += 1
        if all(key in self.resident[g] for g in gpus):
            for g in gpus:
                self.resident[g].move_to_end(key)
            return 0.0
        cap, pinned = usable_bytes(self.gpu), self.pinned() | {key}
        # A pipeline's training state lives on one GPU set: a new set replaces the old (re-sharded from host).
        if key[1] == "train":
            for g in range(self.n):
                for k in [k for k in self.resident[g] if k[:2] == key[:2] and k != key]:
                    if k in pinned:
                        raise OutOfDeviceMemory(f"{key[0]} training state is in use on other GPUs")
                    del self.resident[g][k]
        evicted = 0.0
        for g in gpus:
            res = self.resident[g]
            while sum(res.values()) + self.kv_bytes(g) + bytes_per_gpu > cap:
                victim = next((k for k in res if k not in pinned), None)
                if victim is None:
                    raise OutOfDeviceMemory(
                        f"GPU {g} cannot hold {key[0]} {key[1]} state ({bytes_per_gpu / 2**30:.1f} GiB) beside state "
                        "in use"
                    )
                evicted = max(evicted, res[victim])
                self.evict(victim)  # a state is evicted from every GPU that holds it
            res[key] = bytes_per_gpu
        return self.cost.host_copy(bytes_per_gpu) + self.cost.host_copy(evicted)

    def release_pipeline(self, pipeline: str) -> None:
        """A finished job releases its device memory (its idle state would otherwise shrink others' KV caches)."""
        self.version += 1
        for res in self.resident:
            for k in [k for k in res if k[0] == pipeline]:
                del res[k]
