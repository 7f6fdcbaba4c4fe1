"""``LeaseResidency``: a pipeline's training state is on its workers' devices only while a lease needs it.

Pipelines of a group share the pool's slots (:mod:`.shared_pool`): their workers stay placed, and what one
pipeline keeps on a device between its stages is memory another pipeline's stage cannot use. When a stage's lease
starts, this moves onto the devices the state that stage computes with; when the lease ends, it moves it back to
host memory. It uses verl's own manual load/offload, ``to("device" | "cpu", model=, optimizer=, grad=)`` of the
actor-rollout, reference and critic worker groups (``verl/workers/engine_workers.py``), on any backend verl runs.
The rollout's own state is verl's: the trainer wakes the replicas for the weight sync and sleeps them after
sampling, both inside the pipeline's leases.

On the CPU the device is host memory, so a move changes no placement; the calls and their timing are real.
"""

from __future__ import annotations

import time

from jigsaw_verl.model.graph import INIT, LOGPROB, ROLLOUT, UPDATE, VALIDATE, WEIGHT_SYNC

# what each stage computes with, as verl's ``to`` flags; the rollout stage uses the replicas' own weights and KV
# cache, which verl wakes and sleeps itself; start-up builds the state where verl puts it (the trainer offloads it
# at its end); a validation generates with the replicas (the trainer brings the model on for its sync alone)
STAGE_STATE: dict[str, dict[str, bool]] = {
    ROLLOUT: {},
    LOGPROB: {"model": True, "optimizer": False, "grad": False},
    UPDATE: {"model": True, "optimizer": True, "grad": True},
    WEIGHT_SYNC: {"model": True, "optimizer": False, "grad": False},
    INIT: {},
    VALIDATE: {},
}


class LeaseResidency:
    """Moves a pipeline's training state on and off its leased workers around each stage.

    Args:
        worker_groups: verl worker groups whose ``to`` moves their engine's state (each called once, however many
            roles share it).
    """

    def __init__(self, worker_groups: list):
        unique = {}
        for wg in worker_groups:
            if wg is not None:
                unique.setdefault(id(wg), wg)
        self.worker_groups = list(unique.values())
        self.seconds = {"onload": 0.0, "offload": 0.0}
        self.moves = {"onload": 0, "offload": 0}

    def onload(self, stage: str) -> None:
        """Move the state ``stage`` computes with onto the devices (its lease has just been granted)."""
        self._move(stage, "device", "onload")

    def offload(self, stage: str) -> None:
        """Move the state ``stage`` computed with back to host memory (its lease is about to end)."""
        self._move(stage, "cpu", "offload")

    def _move(self, stage: str, device: str, kind: str) -> None:
        if stage not in STAGE_STATE:
            raise ValueError(f"unknown stage {stage!r}")
        flags = STAGE_STATE[stage]
        if not any(flags.values()):
            return
        started = time.perf_counter()
        for wg in self.worker_groups:
            wg.to(device, **flags)
        self.seconds[kind] += time.perf_counter() - started
        self.moves[kind] += 1

    def take_metrics(self) -> dict[str, float]:
        """``jigsaw/onload_s``, ``jigsaw/offload_s`` and the number of moves since the last call."""
        out = {f"jigsaw/{kind}_s": s for kind, s in self.seconds.items()}
        out.update({f"jigsaw/{kind}s": float(n) for kind, n in self.moves.items()})
        self.seconds = dict.fromkeys(self.seconds, 0.0)
        self.moves = dict.fromkeys(self.moves, 0)
        return out
