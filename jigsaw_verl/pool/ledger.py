"""A pool's device-memory ledger: what each slot's GPU would hold, enforced as a GPU enforces it.

On the CPU every process allocates from host memory, so two pipelines that would overfill a GPU run here anyway.
The ledger is the stand-in for each slot's device memory: every holder (a rollout engine, a worker's FSDP
parameters, gradients, optimizer state, a reference model) charges the bytes it would hold on its slot when they
become resident and releases them when they are freed. A charge that does not fit raises
:class:`DeviceOutOfMemory`, as CUDA's allocator fails, naming the slot, the pipeline and what it tried to hold;
an engine's start-up check (:meth:`DeviceLedger.check_free`) fails as vLLM's does when the slot's free memory is
below what the engine reserves. Every change is written to a timeline (``memory.json`` beside the launcher's
outputs; :func:`memory_track` turns it into a counter track of the Perfetto trace).

The CPU backend keeps one per group (:mod:`jigsaw_verl.runtime.ledger_actor`); its holders are the CPU rollout
server (:mod:`jigsaw_verl.integration.cpu.rollout.server`) and verl's training workers (the patch
``jigsaw_verl.patches.fsdp_ledger``). :func:`engines_awake_outside_leases` checks a timeline against the leases.
Pure: no Ray, verl or torch.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from jigsaw_verl.model.graph import ENGINE_STAGES

MiB = 1024**2


class DeviceOutOfMemory(RuntimeError):
    """A charge that does not fit its slot (the CPU ledger's ``torch.OutOfMemoryError``)."""


@dataclass(frozen=True)
class LedgerEvent:
    """One change of one slot's ledger.

    Attributes:
        t_s: seconds since the ledger started.
        slot: the slot.
        pipeline: the pipeline of the holder.
        holder: what holds the bytes (``engine/r0``, ``actor/rank1``, ``ref/rank0``...).
        held_bytes: what the holder holds after the change (0: released).
        slot_bytes: what the slot holds in all after the change.
    """

    t_s: float
    slot: int
    pipeline: str
    holder: str
    held_bytes: float
    slot_bytes: float


class DeviceLedger:
    """Per-slot device memory of a pool: capacity, who holds what, and the timeline.

    Args:
        num_slots: slots in the pool.
        capacity_bytes: one slot's device memory, bytes (> 0).
        t0: the monotonic time the timeline counts from (the group scheduler's, so it lines up with the leases).
    """

    def __init__(self, num_slots: int, capacity_bytes: float, t0: float | None = None):
        if num_slots < 1:
            raise ValueError(f"the ledger needs at least one slot, got {num_slots}")
        if not capacity_bytes > 0:
            raise ValueError(f"jigsaw.mux.slot_memory_mib: a slot's memory must be positive, got {capacity_bytes}")
        self.capacity = float(capacity_bytes)
        self.held: list[dict[tuple[str, str], float]] = [{} for _ in range(num_slots)]
        self.events: list[LedgerEvent] = []
        self._t0 = time.monotonic() if t0 is None else t0

    def slot_bytes(self, slot: int) -> float:
        """What slot ``slot`` holds in all, bytes."""
        return sum(self._slot(slot).values())

    def charge(self, slot: int, pipeline: str, holder: str, nbytes: float) -> None:
        """``holder`` of ``pipeline`` holds ``nbytes`` on ``slot`` from now (replacing what it held there).

        Raises:
            DeviceOutOfMemory: the slot cannot hold it beside what the others hold; nothing changes.
        """
        held = self._slot(slot)
        others = self.slot_bytes(slot) - held.get((pipeline, holder), 0.0)
        if others + nbytes > self.capacity:
            raise DeviceOutOfMemory(
                f"out of device memory on slot {slot}: pipeline {pipeline!r} tried to hold {nbytes / MiB:.3f} MiB "
                f"for {holder}; the slot holds {others / MiB:.3f} MiB of {self.capacity / MiB:.3f} MiB "
                f"({self._who(slot, (pipeline, holder))})"
            )
        held[(pipeline, holder)] = float(nbytes)
        self._record(slot, pipeline, holder)

    def release(self, slot: int, pipeline: str, holder: str) -> None:
        """``holder`` of ``pipeline`` holds nothing on ``slot`` any more."""
        if self._slot(slot).pop((pipeline, holder), None) is not None:
            self._record(slot, pipeline, holder)

    def release_pipeline(self, pipeline: str) -> None:
        """Everything ``pipeline`` holds anywhere is freed (it ended or crashed: its processes are gone)."""
        for slot, held in enumerate(self.held):
            for key in [k for k in held if k[0] == pipeline]:
                self.release(slot, *key)

    def check_free(self, slot: int, pipeline: str, holder: str, nbytes: float) -> None:
        """An engine's start-up check: the slot's free memory must be at least ``nbytes`` (what vLLM asserts of
        ``gpu_memory_utilization`` x total memory before it profiles)."""
        free = self.capacity - self.slot_bytes(slot)
        if free < nbytes:
            raise DeviceOutOfMemory(
                f"slot {slot}: free memory on startup ({free / MiB:.3f} MiB) is less than what {holder} of pipeline "
                f"{pipeline!r} reserves ({nbytes / MiB:.3f} MiB: gpu_memory_utilization x {self.capacity / MiB:.3f} "
                f"MiB); held: {self._who(slot, None)}"
            )

    def timeline(self) -> dict:
        """``{"capacity_bytes", "slots", "events": [LedgerEvent fields...], "peak_bytes": per slot}``."""
        peak = [0.0] * len(self.held)
        for e in self.events:
            peak[e.slot] = max(peak[e.slot], e.slot_bytes)
        return {
            "capacity_bytes": self.capacity,
            "slots": len(self.held),
            "events": [asdict(e) for e in self.events],
            "peak_bytes": peak,
        }

    def _slot(self, slot: int) -> dict[tuple[str, str], float]:
        if not 0 <= slot < len(self.held):
            raise ValueError(f"slot {slot} is not in the pool's {len(self.held)} slots")
        return self.held[slot]

    def _who(self, slot: int, skip) -> str:
        parts = [f"{p}/{h} {b / MiB:.3f} MiB" for (p, h), b in sorted(self._slot(slot).items()) if (p, h) != skip]
        return ", ".join(parts) or "nothing"

    def _record(self, slot: int, pipeline: str, holder: str) -> None:
        held = self._slot(slot).get((pipeline, holder), 0.0)
        t = time.monotonic() - self._t0
        self.events.append(LedgerEvent(t, slot, pipeline, holder, held, self.slot_bytes(slot)))


ENGINE_HOLDER = "engine/"


def engines_awake_outside_leases(timeline: dict, leases: list[dict], slack_s: float = 0.0) -> list[str]:
    """Each stretch of a :meth:`DeviceLedger.timeline` where a rollout engine (holder ``engine/...``) held memory
    on a slot while its pipeline held none of the leases its engines may be awake in there (``ENGINE_STAGES``:
    rollout, weight sync, init, validation), one line each (``[]``: none).

    Args:
        timeline: the ledger's timeline.
        leases: lease slices (``leases.json`` records: ``pipeline``, ``stage``, ``gpus``, ``start_s``, ``end_s``, on
            the ledger's clock).
        slack_s: how far a charge may precede or a release follow its lease (the calls that report them).
    """
    windows: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for s in leases:
        if s["stage"] in ENGINE_STAGES:
            for g in s["gpus"]:
                windows.setdefault((s["pipeline"], g), []).append((s["start_s"] - slack_s, s["end_s"] + slack_s))
    awake: dict[tuple[int, str, str], float] = {}  # (slot, pipeline, holder) -> since when it holds memory
    stretches = []
    end = max((e["t_s"] for e in timeline["events"]), default=0.0)
    for e in timeline["events"]:
        key = (e["slot"], e["pipeline"], e["holder"])
        if not e["holder"].startswith(ENGINE_HOLDER):
            continue
        if e["held_bytes"] > 0:
            awake.setdefault(key, e["t_s"])
        elif key in awake:
            stretches.append((*key, awake.pop(key), e["t_s"]))
    stretches += [(*key, since, end) for key, since in awake.items()]
    out = []
    for slot, pipeline, holder, start, stop in stretches:
        uncovered = _uncovered(start, stop, windows.get((pipeline, slot), []))
        if uncovered > 0:
            out.append(
                f"slot {slot}: {pipeline}/{holder} held memory {start:.2f}-{stop:.2f} s, {uncovered:.2f} s of it "
                "outside its engine leases"
            )
    return out


def ledger_summary(timeline: dict, leases: list[dict]) -> str:
    """One line on a run's ledger: each slot's peak against its capacity, and the engines awake outside their
    leases (:func:`engines_awake_outside_leases`)."""
    peaks = ", ".join(f"{p / MiB:.3f}" for p in timeline["peak_bytes"])
    awake = engines_awake_outside_leases(timeline, leases)
    return (
        f"device-memory ledger: peak per slot {peaks} MiB of {timeline['capacity_bytes'] / MiB:.3f} MiB; rollout "
        f"engines awake outside their leases: {'; '.join(awake) if awake else 'none'}"
    )


def _uncovered(start: float, stop: float, windows: list[tuple[float, float]]) -> float:
    """Seconds of ``[start, stop]`` no window covers."""
    covered, at = 0.0, start
    for a, b in sorted(windows):
        a, b = max(a, at), min(b, stop)
        if b > a:
            covered += b - a
            at = b
    return max(0.0, (stop - start) - covered)


def memory_track(timeline: dict, pid: int = 0, t0_s: float = 0.0) -> list[dict]:
    """Chrome/Perfetto counter events (``ph: C``), one counter per slot, of a :meth:`DeviceLedger.timeline`, from
    ``t0_s`` on its clock."""
    return [
        {"name": f"slot {e['slot']} memory", "ph": "C", "pid": pid, "ts": round((e["t_s"] - t0_s) * 1e6, 3),
         "args": {"MiB": e["slot_bytes"] / MiB, "capacity MiB": timeline["capacity_bytes"] / MiB}}
        for e in timeline["events"]
    ]  # fmt: skip
