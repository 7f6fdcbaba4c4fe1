"""``torch.cpu`` completed with the ``torch.cuda``-style calls verl makes on its device module.

verl calls ``get_torch_device().<fn>`` for memory statistics, caches, RNG state and IPC; ``torch.cpu`` lacks most
of them. Memory figures report this process's resident set (there is no separate device memory).
"""

from __future__ import annotations

import resource
import sys
from types import ModuleType

import torch

_module = ModuleType("jigsaw_verl_cpu_device")
for _name in dir(torch.cpu):
    if not _name.startswith("__"):
        setattr(_module, _name, getattr(torch.cpu, _name))


def _rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def _meminfo_bytes(field: str) -> int:
    """A ``/proc/meminfo`` field in bytes (0 where there is none)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


_module.empty_cache = lambda: None
_module.ipc_collect = lambda: None
_module.set_per_process_memory_fraction = lambda fraction, device=None: None
_module.memory_allocated = lambda device=None: _rss_bytes()
_module.memory_reserved = lambda device=None: _rss_bytes()
_module.max_memory_allocated = lambda device=None: _rss_bytes()
_module.max_memory_reserved = lambda device=None: _rss_bytes()
_module.reset_peak_memory_stats = lambda device=None: None
_module.mem_get_info = lambda device=None: (_meminfo_bytes("MemAvailable"), _meminfo_bytes("MemTotal"))
_module.get_rng_state = lambda device=None: torch.get_rng_state()
_module.set_rng_state = lambda state, device=None: torch.set_rng_state(state)
_module.manual_seed = torch.manual_seed
_module.manual_seed_all = torch.manual_seed
_module.get_device_name = lambda device=None: "cpu"

cpu_device_module = _module
