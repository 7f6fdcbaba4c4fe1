"""The import-swap way in, produced from the installed verl at run time instead of carried as a copy.

A recipe that builds verl's legacy trainer itself (verl's ``verl/trainer/main_ppo_v0.py`` and the recipes modelled
on it) gains the plugin by one changed line, ``from jigsaw_verl.trainer import RayPPOTrainer``. Rather than keep a
copy of verl's file with that line changed, :func:`swapped_source` reads the installed module's source and swaps
the line; :func:`load_swapped` runs it as a module of its own (``jigsaw_swapped.<module>``) whose classes Ray
pickles by value, so its ``@ray.remote`` ``TaskRunner`` reaches Ray's workers without a file on their path.

The swap refuses, naming the module and verl's version, a source that does not hold the import line exactly once
(a verl whose file changed): nothing is guessed.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

# the legacy trainer's import in verl's recipes, and what the plugin's way in replaces it with
VERL_TRAINER_IMPORT = "from verl.trainer.ppo.ray_trainer import RayPPOTrainer"
JIGSAW_TRAINER_IMPORT = "from jigsaw_verl.trainer import RayPPOTrainer"
# verl's module the legacy drop-in recipe runs (its TaskRunner builds RayPPOTrainer itself)
LEGACY_MAIN = "verl.trainer.main_ppo_v0"


class ImportSwapError(RuntimeError):
    """The installed verl module cannot take the import swap (its source, or the line, is not what it expects)."""


def module_file(module: str) -> Path:
    """The installed source file of ``module``, found without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise ImportSwapError(f"{module} has no Python source in this environment (verl {_verl_version()})")
    return Path(spec.origin)


def swapped_source(module: str = LEGACY_MAIN, old: str = VERL_TRAINER_IMPORT, new: str = JIGSAW_TRAINER_IMPORT) -> str:
    """``module``'s installed source with the line ``old`` replaced by ``new`` (it must occur exactly once)."""
    path = module_file(module)
    lines = path.read_text().splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if line.rstrip("\r\n") == old]
    if len(hits) != 1:
        raise ImportSwapError(
            f"{path} (verl {_verl_version()}) holds the line {old!r} {len(hits)} times, not once: the import swap "
            "is written against verl 0.9.1's file"
        )
    lines[hits[0]] = new + "\n"
    return "".join(lines)


def load_swapped(module: str = LEGACY_MAIN) -> types.ModuleType:
    """Run :func:`swapped_source` of ``module`` as module ``jigsaw_swapped.<module>`` (once per process); Ray
    pickles what it defines by value."""
    import ray.cloudpickle

    name = f"jigsaw_swapped.{module}"
    if name in sys.modules:
        return sys.modules[name]
    swapped = types.ModuleType(name)
    swapped.__file__ = f"<{module} with {JIGSAW_TRAINER_IMPORT!r}>"
    sys.modules[name] = swapped
    try:
        exec(compile(swapped_source(module), swapped.__file__, "exec"), swapped.__dict__)
    except BaseException:
        del sys.modules[name]
        raise
    ray.cloudpickle.register_pickle_by_value(swapped)
    return swapped


def _verl_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("verl")
    except PackageNotFoundError:
        return "not installed"
