"""Do not pin memory in FSDP2's CPU offload policy when the device is the CPU.

What: replaces ``CPUOffloadPolicy`` in ``verl.workers.engine.fsdp.transformer_impl`` with a subclass that
forces ``pin_memory=False`` when verl's current device is ``cpu`` (the class is unchanged otherwise).

Why: verl's FSDP2 engine always gives forward-only models (the reference policy) a
``CPUOffloadPolicy(pin_memory=True)``; pinning needs an accelerator, so on the CPU platform ``fully_shard``
fails with "Cannot access accelerator device when none is available". Offloading to host memory is a no-op
there, pinning is the only part that breaks.
"""

from __future__ import annotations

VERL_VERSIONS = ("0.9.1",)


def is_applied() -> bool:
    from verl.workers.engine.fsdp import transformer_impl

    return getattr(transformer_impl.CPUOffloadPolicy, "_jigsaw_no_pin_on_cpu", False)


def apply() -> None:
    from verl.utils.device import get_device_name
    from verl.workers.engine.fsdp import transformer_impl

    base = transformer_impl.CPUOffloadPolicy

    class CPUOffloadPolicy(base):
        _jigsaw_no_pin_on_cpu = True

        def __init__(self, pin_memory: bool = True):
            super().__init__(pin_memory=pin_memory and get_device_name() != "cpu")

    transformer_impl.CPUOffloadPolicy = CPUOffloadPolicy
