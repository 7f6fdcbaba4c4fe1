"""Reading workload YAML files into :class:`~jigsaw_verl.model.spec.WorkloadSpec` (YAML stays out of core)."""

from __future__ import annotations

from pathlib import Path

import yaml

from jigsaw_verl.model.spec import SpecError, WorkloadSpec, workload_from_dict

BUNDLED_DIR = Path(__file__).resolve().parent.parent / "workloads"


def bundled_workloads() -> list[Path]:
    """The example workloads shipped in the package, sorted by name."""
    return sorted(BUNDLED_DIR.glob("*.yaml"))


def load_workload(path: str | Path) -> WorkloadSpec:
    """Read and validate a workload YAML file. Every problem raises :class:`SpecError`, missing files included."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise SpecError(str(path), "<file>", f"cannot read: {err.strerror or err}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise SpecError(str(path), "<file>", f"not valid YAML: {str(err).splitlines()[0]}") from None
    return workload_from_dict(data, str(path))
