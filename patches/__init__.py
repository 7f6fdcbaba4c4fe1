"""Patches to verl where verl offers no extension point. One module per patch; see README.md.

Each patch module defines ``VERL_VERSIONS`` (the verl releases it was written for and tested on), ``apply()``
(idempotent) and ``is_applied()``. :func:`apply_all` applies every patch once per process and refuses, with a
clear error, to patch a verl release it was not written for.
"""

from __future__ import annotations

import importlib

PATCHES = (
    "jigsaw_verl.patches.gloo_process_group",  # first: verl modules import the function it wraps by name
    "jigsaw_verl.patches.fsdp2_cpu_offload",
    "jigsaw_verl.patches.resource_pool_check",
    "jigsaw_verl.patches.rollout_class_registry",
    "jigsaw_verl.patches.fsdp_ledger",
)


class VerlVersionError(RuntimeError):
    """The installed verl is not a release these patches were written for."""


def installed_verl_version() -> str:
    from importlib.metadata import version

    return version("verl")


def apply_all() -> list[str]:
    """Apply every patch (idempotent); return the names applied in this call."""
    found = installed_verl_version()
    applied = []
    for name in PATCHES:
        mod = importlib.import_module(name)
        if found not in mod.VERL_VERSIONS:
            raise VerlVersionError(
                f"{name} was written for verl {', '.join(mod.VERL_VERSIONS)}; installed verl is {found}. "
                "Re-check the patch against this release before widening VERL_VERSIONS."
            )
        if not mod.is_applied():
            mod.apply()
            applied.append(name)
    return applied
