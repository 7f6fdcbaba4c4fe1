"""Layering: core imports stdlib + numpy only; sim imports core (plus yaml/matplotlib), never verl/torch/ray."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "jigsaw_verl"
STDLIB = set(sys.stdlib_module_names)
HEAVY = {"verl", "torch", "ray", "hydra", "omegaconf", "transformers", "vllm", "sglang"}


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out


def test_core_imports_only_stdlib_and_numpy():
    for f in sorted((PKG / "core").rglob("*.py")):
        bad = _imports(f) - STDLIB - {"numpy"}
        assert not bad, f"{f.relative_to(PKG)} imports {sorted(bad)}"


def test_sim_never_imports_verl_torch_or_ray():
    for f in sorted((PKG / "sim").rglob("*.py")):
        bad = _imports(f) & HEAVY
        assert not bad, f"{f.relative_to(PKG)} imports {sorted(bad)}"
        outside = _imports(f) - STDLIB - {"numpy", "yaml", "matplotlib"}
        assert not outside, f"{f.relative_to(PKG)} imports {sorted(outside)}"


def test_importing_core_and_sim_loads_no_heavy_module():
    code = (
        "import sys, jigsaw_verl.core.graph, jigsaw_verl.core.scheduling, jigsaw_verl.sim.runner;"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {sorted(HEAVY)!r}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
