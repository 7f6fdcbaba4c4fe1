"""Typed settings of the ``jigsaw`` hydra group: ``jigsaw.enable``, ``jigsaw.migration.*``, ``jigsaw.mux.*``.

:meth:`JigsawSettings.from_config` parses the composed verl + jigsaw config once; the integration layer hands the
typed settings (or the fields it needs) down instead of reading ``config.jigsaw.*``.

Every default lives in one place: the group in the packaged ``config/jigsaw_ppo_trainer.yaml``, with the comment
above each key. A config without the group (a trainer built from verl's own config), or without some of its keys,
takes the missing values from that file; the dataclasses have no defaults of their own. Bad input raises
:class:`JigsawConfigError` with one line that names the key and says what would work.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

# the hydra config the entry point composes; its `jigsaw` group holds every default
CONFIG_FILE = Path(__file__).resolve().parent / "config" / "jigsaw_ppo_trainer.yaml"


class JigsawConfigError(ValueError):
    """A ``jigsaw.*`` key is unknown, has a wrong type or value, or asks for what is not supported yet."""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _flag(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise JigsawConfigError(f"{key} must be true or false, got {value!r}")
    return value


def _tail_threshold(key: str, value: Any) -> int:
    if not _is_int(value):
        raise JigsawConfigError(f"{key} must be an integer >= 1 (live requests per replica), got {value!r}")
    if value < 1:
        raise JigsawConfigError(f"{key} must be >= 1, got {value}")
    return value


def _seconds(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value < math.inf):
        raise JigsawConfigError(f"{key} must be a positive number of seconds, got {value!r}")
    return float(value)


def _name_or_null(key: str, value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise JigsawConfigError(f"{key} must be a name (a string) or null, got {value!r}")
    return value


def _slots_or_null(key: str, value: Any) -> int | None:
    if value is not None and (not _is_int(value) or value < 1):
        raise JigsawConfigError(f"{key} must be a positive number of pool slots or null, got {value!r}")
    return value


def _nodes_or_null(key: str, value: Any) -> int | None:
    if value is not None and (not _is_int(value) or value < 1):
        raise JigsawConfigError(f"{key} must be a positive number of nodes or null, got {value!r}")
    return value


def _mib_or_null(key: str, value: Any) -> float | None:
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf
    ):
        raise JigsawConfigError(f"{key} must be a positive number of MiB or null, got {value!r}")
    return None if value is None else float(value)


def _policy(key: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise JigsawConfigError(f"{key} must be a policy name (a string, e.g. jigsaw), got {value!r}")
    return value


def _max_pipelines(key: str, value: Any) -> int:
    if not _is_int(value):
        raise JigsawConfigError(f"{key} must be an integer >= 1 (pipelines), got {value!r}")
    if value < 1:
        raise JigsawConfigError(f"{key}={value}: a group holds at least 1 pipeline")
    return value


def _gpu(key: str, value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise JigsawConfigError(f"{key} must be a GPU type from the catalogue (e.g. H100-80G) or null, got {value!r}")
    return value


def _key(parse: Callable[[str, Any], Any]) -> Any:
    """A leaf key of the group, checked and converted by ``parse(dotted_key, value)``."""
    return field(metadata={"parse": parse})


def _subgroup(cls: type) -> Any:
    """A nested group of keys, parsed into ``cls``."""
    return field(metadata={"group": cls})


@dataclass(frozen=True, kw_only=True)
class MigrationSettings:
    """``jigsaw.migration``: rollout tail migration (trainer mode ``jigsaw``).

    Attributes:
        enable: consolidate the rollout's long tail onto fewer replicas while it generates.
        tail_threshold: live requests per replica (a count, >= 1) below which the tail starts (no request may be
            waiting).
        poll_s: seconds (> 0) between telemetry reads of the replicas.
    """

    enable: bool = _key(_flag)
    tail_threshold: int = _key(_tail_threshold)
    poll_s: float = _key(_seconds)


@dataclass(frozen=True, kw_only=True)
class MuxSettings:
    """``jigsaw.mux``: this pipeline's place in its multiplexing group.

    Attributes:
        group: the multiplexing group to join (a name; ``None`` when not set, which ``jigsaw.enable=true`` refuses).
        pipeline: this pipeline's name in the group; ``None`` takes ``trainer.experiment_name``
            (:func:`~jigsaw_verl.integration.pipeline_spec.mux_pipeline_name`).
        slots: pool slots (a count, >= 1) this pipeline's stages lease; ``None`` takes
            ``trainer.n_gpus_per_node * trainer.nnodes`` (:func:`~jigsaw_verl.integration.pipeline_spec.mux_slots`).
        pool_slots: slots (a count, >= 1) in the group's pool, used by the pipeline that creates the group; ``None``
            takes this pipeline's slots.
        pool_nodes: nodes (a count, >= 1) the group's pool spans, ``pool_slots / pool_nodes`` slots on each, used by
            the pipeline that creates the group; ``None`` takes ``trainer.nnodes`` when ``pool_slots`` is ``None``,
            else 1 (:func:`~jigsaw_verl.integration.pipeline_spec.mux_pool_topology`).
        policy: scheduling policy of the group (a registry name: ``jigsaw``, ``greedy``, a baseline).
        max_pipelines: most pipelines (a count, >= 1) the group holds at once, used by the pipeline that creates it:
            each worker takes ``1 / (3 * max_pipelines)`` of a pool slot's Ray resources.
        offload: move the training state onto the workers' devices when a stage's lease starts and back to host
            memory when it ends.
        pin_cores: on the CPU backend, run the pipeline's workers and rollout servers on their pool slots' own cores
            (:mod:`~jigsaw_verl.integration.cpu.slot_cores`); ignored on GPUs.
        gpu: GPU type from the catalogue (``H100-80G``, ...) for the policy's cost model; ignored on the CPU.
        slot_memory_mib: device memory of one pool slot, MiB (> 0), that the group's memory rule plans with and the
            CPU backend's ledger enforces; ``None``: ``gpu``'s memory, on the CPU scaled to the model
            (:func:`~jigsaw_verl.model.slots.sized_slot`).
        sample_poll_s: seconds (> 0) between the checks of verl's replay buffer for the step's finished samples (its
            ``poll_interval``, 2 s in verl): the rollout's lease, and the slots under it, end only when a check finds
            the batch complete.
    """

    group: str | None = _key(_name_or_null)
    pipeline: str | None = _key(_name_or_null)
    slots: int | None = _key(_slots_or_null)
    pool_slots: int | None = _key(_slots_or_null)
    pool_nodes: int | None = _key(_nodes_or_null)
    policy: str = _key(_policy)
    max_pipelines: int = _key(_max_pipelines)
    offload: bool = _key(_flag)
    pin_cores: bool = _key(_flag)
    gpu: str | None = _key(_gpu)
    slot_memory_mib: float | None = _key(_mib_or_null)
    sample_poll_s: float = _key(_seconds)


@dataclass(frozen=True, kw_only=True)
class JigsawSettings:
    """The ``jigsaw`` group of a run.

    Attributes:
        enable: turn on pipeline multiplexing (join ``mux.group``); ``False``: the run is verl's own.
        migration: rollout tail migration.
        mux: the pipeline's multiplexing group.
    """

    enable: bool = _key(_flag)
    migration: MigrationSettings = _subgroup(MigrationSettings)
    mux: MuxSettings = _subgroup(MuxSettings)

    @classmethod
    def from_config(cls, config: Mapping | None) -> JigsawSettings:
        """Parse the ``jigsaw`` group of ``config`` (verl's composed DictConfig, or a nested dict).

        Keys the group leaves out (or a config without the group, or ``None``) take the packaged YAML's defaults.

        Raises:
            JigsawConfigError: an unknown key, or a value of the wrong type or out of range (one line).
        """
        node = config.get("jigsaw") if config is not None else None
        return _parse(cls, "jigsaw", node, packaged_defaults())


# the known keys of each level of the group
LEVELS: dict[str, type] = {"jigsaw": JigsawSettings, "jigsaw.migration": MigrationSettings, "jigsaw.mux": MuxSettings}
KNOWN_KEYS: dict[str, frozenset[str]] = {level: frozenset(f.name for f in fields(c)) for level, c in LEVELS.items()}


def refuse_unknown(level: str, key: str) -> None:
    """Raise :class:`JigsawConfigError` unless ``key`` is a key of ``level`` (``jigsaw``, ``jigsaw.mux``...)."""
    known = KNOWN_KEYS[level]
    if key not in known:
        raise JigsawConfigError(f"unknown key {level}.{key} (known: {', '.join(sorted(known))})")


@functools.cache
def _load_defaults() -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.load(CONFIG_FILE).jigsaw)


def packaged_defaults() -> dict:
    """The ``jigsaw`` group of the packaged hydra YAML as a nested dict (a fresh copy)."""
    import copy

    return copy.deepcopy(_load_defaults())


def _parse(cls: type, level: str, node: Any, defaults: Mapping) -> Any:
    if node is None:
        node = {}
    if not isinstance(node, Mapping):
        known = ", ".join(sorted(KNOWN_KEYS[level]))
        raise JigsawConfigError(f"{level} must be a group of keys ({known}), got {node!r}")
    for key in sorted(node):
        refuse_unknown(level, str(key))
    values = {}
    for f in fields(cls):
        dotted = f"{level}.{f.name}"
        value = node[f.name] if f.name in node else defaults[f.name]
        if "group" in f.metadata:
            values[f.name] = _parse(f.metadata["group"], dotted, value, defaults[f.name])
        else:
            values[f.name] = f.metadata["parse"](dotted, value)
    return cls(**values)
