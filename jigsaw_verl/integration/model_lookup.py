"""Find a verl run's model config before Ray starts: a local folder, or a Hugging Face hub id in the local cache.

verl loads ``actor_rollout_ref.model.path`` through transformers (``verl/utils/fs.py: copy_to_local`` leaves a hub
id as it is, and ``AutoConfig``/``AutoTokenizer.from_pretrained`` resolve it), so a recipe may name ``Qwen/Qwen3-8B``.
The scheduler needs the model's ``config.json`` to plan; this reads it the way transformers would find it without
the network: ``<path>/config.json``, else the hub cache's copy (``huggingface_hub.try_to_load_from_cache``, which
honours ``HF_HOME`` / ``HF_HUB_CACHE``). A model found neither way is refused in one line naming the key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from jigsaw_verl.integration.settings import JigsawConfigError

MODEL_KEY = "actor_rollout_ref.model.path"


@dataclass(frozen=True, kw_only=True)
class FoundModel:
    """A model's ``config.json`` and where it was found.

    Attributes:
        name: the model's short name (the folder's or the hub id's last part).
        config: the parsed ``config.json``.
        source: the file it was read from.
    """

    name: str
    config: dict
    source: Path


def find_model_config(path: str) -> FoundModel:
    """The ``config.json`` of ``actor_rollout_ref.model.path``; raises :class:`JigsawConfigError` naming the key."""
    if not path or path == "None":
        raise JigsawConfigError(f"{MODEL_KEY} is not set: give a local model folder or a Hugging Face model id")
    local = Path(path).expanduser()
    if local.is_dir():
        source = local / "config.json"
        if not source.is_file():
            raise JigsawConfigError(f"{MODEL_KEY}={path!r} is a folder without config.json: not a model folder")
        return FoundModel(name=local.resolve().name, config=_read(source), source=source)
    if "://" in path or path.startswith(("/", ".", "~")) or path.count("/") != 1:
        raise JigsawConfigError(
            f"{MODEL_KEY}={path!r} is neither a local model folder nor a Hugging Face model id (org/name): copy the "
            "model to a local folder and give its path"
        )
    source = _cached_config(path)
    if source is None:
        raise JigsawConfigError(
            f"{MODEL_KEY}={path!r} is not in the local Hugging Face cache ({_cache_dir()}) and no local folder has "
            f"that name: download it first (`hf download {path}`) or give a local model folder"
        )
    return FoundModel(name=path.split("/")[-1], config=_read(source), source=source)


def _cached_config(repo_id: str) -> Path | None:
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, "config.json")
    return Path(found) if isinstance(found, str) else None


def _cache_dir() -> str:
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def _read(source: Path) -> dict:
    try:
        return json.loads(source.read_text())
    except (OSError, ValueError) as err:
        raise JigsawConfigError(f"{MODEL_KEY}: cannot read {source}: {err}") from None
