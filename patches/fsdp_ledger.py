"""Charge the CPU backend's device-memory ledger for what verl's training workers would hold on their GPU.

What: wraps ``TrainingWorker.reset`` and ``TrainingWorker.to`` (``verl/workers/engine_workers.py``; verl's actor,
critic and reference engines are each a ``TrainingWorker``). After ``reset`` (the engine is built) a trainable
engine charges its parameters on its slot, as FSDP leaves them on the device, unless verl offloads them itself
(``fsdp_config.param_offload`` or ``offload_policy``). After ``to("device", model=, optimizer=, grad=)`` it charges
what the flags moved on (parameters; gradients, parameter-sized; the optimizer's state, or Adam's two
parameter-sized moments before the first step creates them), after ``to("cpu", ...)`` it releases them. A
forward-only engine (the reference policy) charges nothing: verl's FSDP engines always give it CPU offload and
its ``to`` returns before moving anything (``verl/workers/engine/fsdp/transformer_impl.py``). The real call runs
first and unchanged; outside a pool with a ledger (a run alone, GPUs) nothing is charged.

Why: on the CPU platform the device is host memory, so verl's moves change nothing a test could see, and a
pipeline that kept its training state on a shared slot would not fail as it does on a GPU. verl has no hook around
a worker's moves. Applied with the CPU backend's other patches (``VERL_PLATFORM=cpu``).
"""

from __future__ import annotations

import functools

VERL_VERSIONS = ("0.9.1",)
_MARK = "_jigsaw_ledger"
# Adam keeps two moments per parameter, each the parameter's size
ADAM_MOMENTS = 2


def _local_bytes(tensors) -> float:
    """Bytes of this rank's shards (FSDP2 parameters are DTensors)."""
    total = 0.0
    for t in tensors:
        local = t.to_local() if hasattr(t, "to_local") else t
        total += local.numel() * local.element_size()
    return total


def _optimizer_bytes(optimizer, param_bytes: float) -> float:
    import torch

    state = [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor) and v.dim() > 0]
    return _local_bytes(state) if state else ADAM_MOMENTS * param_bytes


def _holder(worker) -> str:
    import torch.distributed as dist

    role = "critic" if worker.config.model_type == "value_model" else "actor"
    return f"{role}/rank{dist.get_rank() if dist.is_initialized() else 0}"


def _memory(worker):
    """The worker's slot in its pool's ledger (looked up once), or ``None``."""
    if not hasattr(worker, "_jigsaw_memory"):
        from jigsaw_verl.integration.cpu.slot_memory import slot_memory_of_this_worker

        worker._jigsaw_memory = slot_memory_of_this_worker()
    return worker._jigsaw_memory


def _charge_moved(worker, device: str, model: bool, optimizer: bool, grad: bool) -> None:
    engine = worker.engine
    memory = _memory(worker)
    if memory is None or engine.engine_config.forward_only:
        return
    params = _local_bytes(engine.module.parameters())
    parts = {"params": (model, params), "grads": (grad, params)}
    if engine.optimizer is not None:
        parts["optim"] = (optimizer, _optimizer_bytes(engine.optimizer, params))
    holder = _holder(worker)
    for part, (moved, nbytes) in parts.items():
        if moved and device == "cpu":
            memory.release(f"{holder}/{part}")
        elif moved:
            memory.charge(f"{holder}/{part}", nbytes)


def _wrap_reset(reset):
    @functools.wraps(reset)
    def wrapped(self, *args, **kwargs):
        out = reset(self, *args, **kwargs)
        cfg = self.engine.engine_config
        if not (cfg.forward_only or cfg.param_offload or getattr(cfg, "offload_policy", False)):
            _charge_moved(self, "device", model=True, optimizer=False, grad=False)
        return out

    return wrapped


def _wrap_to(to):
    @functools.wraps(to)
    def wrapped(self, device, model=True, optimizer=True, grad=True):
        out = to(self, device, model=model, optimizer=optimizer, grad=grad)
        _charge_moved(self, device, model, optimizer, grad)
        return out

    return wrapped


def is_applied() -> bool:
    from verl.workers.engine_workers import TrainingWorker

    return getattr(TrainingWorker.to, _MARK, False)


def apply() -> None:
    from verl.workers.engine_workers import TrainingWorker

    for name, wrap in (("reset", _wrap_reset), ("to", _wrap_to)):
        wrapped = wrap(getattr(TrainingWorker, name))
        setattr(wrapped, _MARK, True)
        setattr(TrainingWorker, name, wrapped)
