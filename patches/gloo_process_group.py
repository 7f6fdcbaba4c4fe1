"""Use plain ``gloo`` for the global process group on the CPU platform.

What: wraps ``verl.utils.distributed.initialize_global_process_group_ray`` so that, when the current device is
``cpu`` and the caller gave no backend, it passes ``backend="gloo"``. Everything else goes through unchanged.

Why: verl builds the backend string ``f"cpu:gloo,{device}:{comm_backend}"``, which on the CPU platform becomes
``cpu:gloo,cpu:gloo`` and torch rejects it ("Duplicate device type cpu"). The function already takes a
``backend`` argument; nothing above it lets a platform choose it. Must be applied before
``verl.workers.engine_workers`` is imported (it imports the function by name); the CPU plugin does so.
"""

from __future__ import annotations

import functools

VERL_VERSIONS = ("0.9.1",)
_MARK = "_jigsaw_gloo_on_cpu"


def is_applied() -> bool:
    from verl.utils import distributed

    return getattr(distributed.initialize_global_process_group_ray, _MARK, False)


def apply() -> None:
    from verl.utils import distributed

    original = distributed.initialize_global_process_group_ray

    @functools.wraps(original)
    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        if backend is None and distributed.get_device_name() == "cpu":
            backend = "gloo"
        return original(timeout_second=timeout_second, backend=backend)

    setattr(initialize_global_process_group_ray, _MARK, True)
    distributed.initialize_global_process_group_ray = initialize_global_process_group_ray
