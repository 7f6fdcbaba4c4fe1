"""The live scheduler: one named, detached Ray actor per ``jigsaw.mux.group`` that owns the group's pool.

The actor owns the pool: one placement group per node of the pool (one bundle per slot, on a Ray node of its own,
made by :meth:`MuxScheduler.reserve`, which the launcher calls before it starts any pipeline, or at the first
:meth:`MuxScheduler.pool` call): every joined pipeline places its worker groups in it (:mod:`.shared_pool`) and
reports where they went (:meth:`MuxScheduler.placed`). The watchdog also watches the pool's Ray nodes: a node that
dies takes the pipelines living on it out of the group (``LiveExecutor.lose_node``). Pipelines find it by name
(:func:`get_scheduler`), join with their planning spec and slot need, then ask for every stage before running it
(``acquire``, which returns when the policy grants it) and report its end (``release``). The actor runs a
:class:`~jigsaw_verl.runtime.executor.LiveExecutor` (the core policy, the same object the simulator runs). A
pipeline that dies is noticed by a watchdog that pings the actor it joined with; its leases are reclaimed and the
others go on. ``trace()`` returns every lease held, for the combined Perfetto trace and utilisation plot the
launcher writes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import asdict, replace

import ray
from ray.util.placement_group import NODE_ID_LABEL_KEY as NODE_ID_LABEL
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from jigsaw_verl.model.catalogue import GPUSpec
from jigsaw_verl.model.engine_memory import EngineReservation
from jigsaw_verl.model.spec import PipelineSpec
from jigsaw_verl.model.spec_record import spec_record
from jigsaw_verl.model.topology import PoolTopology
from jigsaw_verl.runtime.executor import (
    EngineMemoryRefused,
    Grant,
    LiveExecutor,
    PolicyRefused,
    PoolTooSmall,
    ReplicaReport,
)
from jigsaw_verl.runtime.ledger_actor import NAMESPACE, create_ledger
from jigsaw_verl.runtime.live_policy import live_policy_factory
from jigsaw_verl.runtime.pool_placement import VERL_COLOCATE, PoolPlacement, pool_bundle, pool_group_name

logger = logging.getLogger(__name__)

# the Ray resource of a CPU backend's slot (verl's CPU platform: a slot is one CPU)
CPU_RESOURCE = "CPU"
# how long the pool's placement group may take to be placed before the group reports the cluster too small
POOL_READY_TIMEOUT_S = 120.0


def actor_name(group: str) -> str:
    return f"jigsaw-mux-{group}"


class MuxScheduler:
    """The pool of one multiplexing group (wrapped as a Ray actor by :func:`get_scheduler`).

    Args:
        group: group name.
        num_slots: slots in the pool.
        gpu: slot hardware for the policy's cost model.
        policy: policy name (``jigsaw.mux.policy``).
        max_pipelines: most pipelines the group holds at once (each worker takes ``1 / (3 * max_pipelines)`` of a
            slot's Ray resources, so all of them fit into the pool's bundles).
        watchdog_s: how often joined pipelines are checked for life.
    """

    def __init__(
        self,
        group: str,
        num_slots: int,
        gpu: GPUSpec,
        policy: str,
        max_pipelines: int,
        watchdog_s: float = 1.0,
        nodes: int = 1,
    ):
        if max_pipelines < 1:
            raise ValueError(f"jigsaw.mux.max_pipelines must be at least 1, got {max_pipelines}")
        if nodes < 1 or num_slots % nodes:
            raise ValueError(f"jigsaw.mux.pool_nodes={nodes}: the pool's {num_slots} slots must cut into equal nodes")
        self.group = group
        self.max_pipelines = max_pipelines
        self._pool: tuple[str, PoolPlacement] | None = None
        # pipelines ask for the pool concurrently (an async actor): the first makes it, the others wait for it
        self._pool_made = asyncio.Lock()
        self.slot_memory_bytes = gpu.memory_bytes
        self._ledger = None  # the CPU backend's device-memory ledger, made with the pool
        self._placed: dict[str, list[dict]] = {}
        try:
            factory, self.refused = live_policy_factory(policy), None
        except PolicyRefused as err:  # every join is refused with this line; the actor itself stays up to say so
            factory, self.refused = None, err
        topology = PoolTopology.of_nodes(nodes, num_slots // nodes)
        self.executor = LiveExecutor(num_slots, gpu, factory, policy_name=policy, topology=topology)
        self.node_ids: list[str] = []  # the Ray node of each pool node, once the pool is made
        self.lost_nodes: set[int] = set()
        self._homes: dict[str, list[int]] = {}
        self._joined: list[dict] = []  # what each pipeline joined with, for a replay of the run (group.json)
        self._start_up: dict[str, dict[str, float]] = {}  # pipeline -> stage -> when it asked for it (step -1)
        self.t0 = time.monotonic()
        self.watchdog_s = watchdog_s
        self._events: dict[tuple[str, int, str], asyncio.Event] = {}
        self._grants: dict[tuple[str, int, str], Grant] = {}
        self._owners: dict[str, object] = {}
        self._watchdog: asyncio.Task | None = None
        self.errors: dict[str, str] = {}

    def _now(self) -> float:
        return time.monotonic() - self.t0

    def _deliver(self, grants: list[Grant]) -> None:
        for g in grants:
            key = (g.pipeline, g.step, g.stage)
            self._grants[key] = g
            self._events.setdefault(key, asyncio.Event()).set()

    async def join(
        self,
        pipeline: PipelineSpec,
        slots: int,
        owner=None,
        offload: bool = True,
        engine: EngineReservation | None = None,
    ) -> dict:
        """Join the group with the pipeline's planning spec and slot need; ``owner`` is an actor handle whose
        death means the pipeline crashed; ``offload``: whether its training state leaves the devices between
        leases; ``engine``: what its rollout engine reserves and it pins per slot. Raises :class:`PoolTooSmall` for
        a pipeline that cannot fit, :class:`EngineMemoryRefused` for one whose engine does not fit beside those on
        its home, :class:`PolicyRefused` when the group's policy cannot run live."""
        try:
            if self.refused is not None:
                raise self.refused
            self.executor.join(pipeline, slots, self._now(), offload=offload, engine=engine)
        except (PoolTooSmall, PolicyRefused, EngineMemoryRefused) as err:
            self.errors[pipeline.name] = str(err)
            raise
        self._homes[pipeline.name] = list(self.executor.home(pipeline.name))
        self._joined.append(
            {
                "spec": spec_record(pipeline),
                "slots": slots,
                "offload": offload,
                "engine": None if engine is None else asdict(engine),
                "home": self._homes[pipeline.name],
                "joined_s": self._now(),
            }
        )
        if owner is not None:
            self._owners[pipeline.name] = owner
        if self._watchdog is None:
            self._watchdog = asyncio.get_running_loop().create_task(self._watch())
        return {"group": self.group, "num_slots": self.executor.num_slots, "policy": self.executor.policy_name}

    async def pool(self, device_resource: str, pipeline: str) -> PoolPlacement:
        """The pool's placement groups, made at the first call: one per node, one bundle per slot, shaped as verl
        shapes its own, with room in each for one worker of every pipeline the group may hold; and where in it the
        (joined) ``pipeline`` places its workers (its home slots)."""
        await self.reserve(device_resource)
        if self._pool[0] != device_resource:
            raise ValueError(
                f"group {self.group!r} pools {self._pool[0]} slots; a pipeline on {device_resource} cannot join it"
            )
        return replace(self._pool[1], first_slot=self.executor.home(pipeline)[0])

    async def reserve(self, device_resource: str, homes: dict[str, tuple[int, ...]] | None = None) -> None:
        """Make the pool now if it is not made yet (the launcher does, before it starts any pipeline, so the
        pool's placement groups take their nodes before the pipelines' other actors are placed); ``homes``: where
        the named pipelines will live when they join (the launcher's group check placed them, in its order)."""
        if homes:
            self.executor.plan_homes(homes)
        async with self._pool_made:  # a call that comes while the first awaits the placement waits for it
            if self._pool is None:
                await self._make_pool(device_resource)

    async def _make_pool(self, device_resource: str) -> None:
        from ray.util.placement_group import placement_group

        topology, colocate = self.executor.topology, VERL_COLOCATE * self.max_pipelines
        bundle = pool_bundle(device_resource, colocate)
        self.node_ids = await asyncio.to_thread(pool_nodes, bundle, topology, self.group)
        pgs = [
            placement_group(
                [dict(bundle) for _ in range(topology.slots_per_node)],
                strategy="STRICT_PACK",
                name=pool_group_name(self.group, k),
                bundle_label_selector=[{NODE_ID_LABEL: node_id}] * topology.slots_per_node,
            )
            for k, node_id in enumerate(self.node_ids)
        ]
        try:
            await asyncio.wait_for(asyncio.gather(*(pg.ready() for pg in pgs)), timeout=POOL_READY_TIMEOUT_S)
        except asyncio.TimeoutError:
            for pg in pgs:
                ray.util.remove_placement_group(pg)
            raise RuntimeError(
                f"group {self.group!r}: the Ray cluster cannot place a pool of {topology.describe()} of {bundle} "
                f"within {POOL_READY_TIMEOUT_S:.0f} s"
            ) from None
        placement = PoolPlacement(tuple(pgs), topology.slots_per_node, colocate, topology.num_slots, self.group)
        self._pool = (device_resource, placement)
        if device_resource == CPU_RESOURCE:  # the CPU enforces no device memory: the ledger does
            self._ledger = create_ledger(self.group, topology.num_slots, self.slot_memory_bytes, self.t0)
            await self._ledger.__ray_ready__.remote()

    async def memory(self) -> dict | None:
        """The device-memory ledger's timeline (``memory.json``), or ``None`` when the pool has none (GPUs)."""
        return None if self._ledger is None else await self._ledger.timeline.remote()

    async def placed(self, pipeline: str, workers: list[dict]) -> None:
        """A pipeline reports where its workers went (each: ``placement_group_id``, ``node_id``)."""
        self._placed[pipeline] = list(workers)

    def group(self) -> dict:
        """What a replay of the run needs (``group.json``, :mod:`.live_replay`): the pool, the slot hardware the
        policy planned with, the policy, and every pipeline as it joined (planning spec, slots, offload, engine,
        home, when) with when it asked for its start-up and first sync (``requested_s``)."""
        topology = self.executor.topology
        return {
            "policy": self.executor.policy_name,
            "num_slots": topology.num_slots,
            "slots_per_node": topology.slots_per_node,
            "slot": spec_record(self.executor.gpu),
            "pipelines": [{**j, "requested_s": self._start_up.get(j["spec"]["name"], {})} for j in self._joined],
        }

    def placement(self) -> dict:
        """The pool's nodes (each: its Ray node, placement group and slots) and where every pipeline's workers
        are (``pool.json``)."""
        pool, topology = None if self._pool is None else self._pool[1], self.executor.topology
        nodes = [
            {"node_id": node_id, "placement_group_id": pg.id.hex(), "slots": list(topology.node_slots(k))}
            for k, (node_id, pg) in enumerate(zip(self.node_ids, pool.placement_groups if pool else (), strict=False))
        ]
        return {
            "num_slots": topology.num_slots,
            "slots_per_node": topology.slots_per_node,
            "nodes": nodes,
            "lost_nodes": sorted(self.lost_nodes),
            "max_colocate_count": None if pool is None else pool.max_colocate_count,
            "pipelines": dict(self._placed),
            "homes": dict(self._homes),
        }

    async def acquire(self, pipeline: str, step: int, stage: str) -> dict:
        """Wait until ``stage`` of ``step`` is granted; return the grant."""
        if step < 0:  # start-up and the first sync: when they were asked for (group.json), not only granted
            self._start_up.setdefault(pipeline, {})[stage] = self._now()
        self._deliver(self.executor.request(pipeline, step, stage, self._now()))
        return await self._granted(pipeline, step, stage)

    async def handover(self, pipeline: str, held_step: int, held_stage: str, step: int, stage: str) -> dict:
        """End the held ``held_stage`` of ``held_step`` and start ``stage`` of ``step`` on its slots at once (the
        executor's ``handover``: the pipeline's engines stay awake across the two); return the grant."""
        self._deliver(self.executor.handover(pipeline, held_step, held_stage, step, stage, self._now()))
        return await self._granted(pipeline, step, stage)

    async def _granted(self, pipeline: str, step: int, stage: str) -> dict:
        """Wait until ``stage`` of ``step`` of ``pipeline`` is granted (``_deliver`` sets its event)."""
        key = (pipeline, step, stage)
        await self._events.setdefault(key, asyncio.Event()).wait()
        self._events.pop(key, None)
        if key not in self._grants:
            raise RuntimeError(
                f"{pipeline} left group {self.group} while waiting for {stage} of step {step}: "
                f"{self.executor.left.get(pipeline, 'removed')}"
            )
        return asdict(self._grants.pop(key))

    async def release(self, pipeline: str, step: int, stage: str, finish_offsets_s: tuple[float, ...] = ()) -> None:
        """``stage`` of ``step`` ended (a rollout: with when each response finished, seconds after its grant)."""
        self._deliver(self.executor.finish(pipeline, step, stage, self._now(), tuple(finish_offsets_s)))

    async def report_replicas(self, pipeline: str, step: int, replicas: list[dict]) -> list[dict]:
        """A running rollout's replicas now (``ReplicaReport`` fields by rank); returns the migration orders the
        policy made for this pipeline (each once), to run through its migrator and confirm with ``migrated``."""
        reports = [ReplicaReport(**r) for r in replicas]
        grants, orders = self.executor.report_replicas(pipeline, step, reports, self._now())
        self._deliver(grants)
        return [asdict(o) for o in orders]

    async def migrated(self, pipeline: str, step: int, sources: list[int]) -> None:
        """The pipeline moved every request off replica ranks ``sources``: their slots go back to the pool."""
        self._deliver(self.executor.migrated(pipeline, step, tuple(sources), self._now()))

    async def leave(self, pipeline: str, reason: str = "finished") -> None:
        """Leave the group (a finished pipeline); its leases, if any, go back to the pool."""
        self._deliver(self.executor.leave(pipeline, self._now(), reason))
        await self._forget(pipeline)

    async def _forget(self, pipeline: str) -> None:
        """What the scheduler keeps of a pipeline that left the executor: its owner, its ledger charges, its waits."""
        self._owners.pop(pipeline, None)
        if self._ledger is not None:  # its processes end (or ended): what they held is freed
            await self._ledger.release_pipeline.remote(pipeline)
        for key, event in list(self._events.items()):
            if key[0] == pipeline:  # wake its waiting acquire, which then raises
                event.set()

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.watchdog_s)
            try:
                await self._watch_nodes()
            except Exception:  # a GCS hiccup must not end the watchdog: the next turn asks again
                logger.exception("group %s: checking the pool's nodes failed", self.group)
            for name, owner in list(self._owners.items()):
                try:
                    await asyncio.wait_for(owner.__ray_ready__.remote(), timeout=30 * self.watchdog_s)
                except asyncio.TimeoutError:
                    continue  # a loaded machine answers late; only a dead actor counts
                except ray.exceptions.RayActorError as err:
                    logger.warning("pipeline %s of group %s is gone (%s); reclaiming its leases", name, self.group, err)
                    await self.leave(name, reason=f"crashed: {type(err).__name__}")

    async def _watch_nodes(self) -> None:
        """A pool node whose Ray node died takes the pipelines living on it out of the group at once (their workers
        are gone; the executor marks its slots lost first, so nothing is granted or homed there again), and each
        pipeline that lived on it and had not finished gets an error naming the node."""
        if not self.node_ids:
            return
        alive = {n["NodeID"] for n in await asyncio.to_thread(ray.nodes) if n["Alive"]}
        for k, node_id in enumerate(self.node_ids):
            if k in self.lost_nodes or node_id in alive:
                continue
            slots = set(self.executor.topology.node_slots(k))
            living = [name for name, home in self._homes.items() if slots & set(home)]
            gone = [name for name in living if name in self.executor.pipes]
            for name in living:
                if self.executor.left.get(name) != "finished" or name in gone:
                    self.errors[name] = f"pool node {k} (Ray node {node_id}) left the cluster"
            logger.warning("group %s lost pool node %d (Ray node %s); pipelines %s leave", self.group, k, node_id, gone)
            self.lost_nodes.add(k)
            self._deliver(self.executor.lose_node(k, self._now()))  # its pipelines leave, in one step
            for name in gone:
                await self._forget(name)

    def status(self) -> dict:
        ex = self.executor
        return {
            "group": self.group,
            "num_slots": ex.num_slots,
            "policy": ex.policy_name,
            "pipelines": {
                name: {
                    "steps": ps.spec.steps,
                    "steps_done": ps.progress.steps_done,
                    "running": [f"{stage} of step {step}" for step, stage in ps.running],
                    "waiting": None if ps.requested is None else f"{ps.requested[1]} of step {ps.requested[0]}",
                }
                for name, ps in ex.pipes.items()
            },
            "left": dict(ex.left),
            "left_steps": dict(ex.left_steps),
            "free_slots": ex.free_slots(),
            "lost_nodes": sorted(self.lost_nodes),
            "errors": dict(self.errors),
            "policy_errors": list(ex.policy_errors[-5:]),
        }

    def history(self) -> list[dict]:
        """Every finished stage as the policy's predictor sees it (rollouts with their live-batch curve)."""
        return [asdict(h) for h in self.executor.history]

    def trace(self) -> list[dict]:
        """Every lease held so far (finished ones and those still running up to now), one slice per segment of
        constant share."""
        now = self._now()
        done = [_lease(s) for s in self.executor.slices]
        return done + [{**_lease(s), "running": True} for s in self.executor.open_slices(now)]


def _lease(s) -> dict:
    """A lease slice as ``leases.json`` holds it: the timeline record plus its share and whether it was forced."""
    return {**asdict(s), "sm_share": s.sm_share, "forced": s.forced}


def pool_nodes(bundle: dict[str, float], topology: PoolTopology, group: str) -> list[str]:
    """The Ray nodes the pool's nodes go on, in pool order: alive nodes with room for a node's bundles, the
    caller's (the launcher's) last; ``RuntimeError`` naming the shape when the cluster has too few."""
    need = {k: v * topology.slots_per_node for k, v in bundle.items()}
    here = ray.get_runtime_context().get_node_id()
    fits = [n for n in ray.nodes() if n["Alive"] and all(n["Resources"].get(k, 0.0) >= v for k, v in need.items())]
    fits.sort(key=lambda n: (n["NodeID"] == here, n.get("NodeName", ""), n["NodeID"]))
    if len(fits) < topology.nodes:
        raise RuntimeError(
            f"group {group!r}: a pool of {topology.describe()} needs {topology.nodes} Ray node(s) with {need} each; "
            f"the cluster has {len(fits)} (start one with `ray start` on each node and set RAY_ADDRESS)"
        )
    return [n["NodeID"] for n in fits[: topology.nodes]]


class Presence:
    """A pipeline's token of life: an idle actor its trainer creates, so it dies with the trainer (Ray kills the
    actors a dead worker owns). The scheduler pings it; the trainer itself is too busy running ``fit`` to answer."""

    def alive(self) -> bool:
        return True


def get_scheduler(
    group: str,
    num_slots: int | None = None,
    gpu: GPUSpec | None = None,
    policy: str | None = None,
    max_pipelines: int | None = None,
    nodes: int = 1,
):
    """The group's scheduler actor: found by name, or created (detached, on the caller's node, which it then
    outlives no other node's loss for) when ``num_slots`` and ``gpu`` are given; ``nodes``: the nodes its pool
    spans. Ray must be initialised."""
    name = actor_name(group)
    try:
        return ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        if None in (num_slots, gpu, policy, max_pipelines):
            raise LookupError(f"no multiplexing group {group!r} is running (actor {name} in {NAMESPACE})") from None
    return (
        ray.remote(MuxScheduler)
        .options(
            name=name,
            namespace=NAMESPACE,
            lifetime="detached",
            get_if_exists=True,
            num_cpus=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False),
        )
        .remote(group, num_slots, gpu, policy, max_pipelines, nodes=nodes)
    )
