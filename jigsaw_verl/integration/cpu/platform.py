"""verl platform ``cpu``: torch on the CPU, collectives over gloo, Ray CPU slots instead of GPUs.

Registered through verl's own extension point (``PlatformRegistry.register``). It is never auto-detected, so
installing jigsaw-verl changes nothing on GPU machines: it is selected with ``VERL_PLATFORM=cpu``, which
:func:`jigsaw_verl.integration.cpu.backend.activate` sets for the driver and every Ray worker when
``trainer.device=cpu``.
"""

from __future__ import annotations

from contextlib import contextmanager
from types import ModuleType
from typing import Any

import torch
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry

from jigsaw_verl.integration.cpu.device_module import cpu_device_module


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformBase):
    """The CPU as verl's accelerator (a test bench: same code paths, gloo instead of NCCL)."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> ModuleType:
        return cpu_device_module

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        return False  # only ever selected explicitly (VERL_PLATFORM=cpu)

    def current_device(self) -> torch.device:
        # NOTE: verl passes this to ``.to(device=...)``; an int would mean cuda:<int>.
        return torch.device("cpu")

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "JIGSAW_VERL_VISIBLE_CPUS"

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def ray_resource_name(self) -> str:
        return "CPU"

    def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
        return {"num_cpus": num_gpus}

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def cudart(self) -> Any:
        return None
