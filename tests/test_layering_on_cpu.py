"""Layering: each layer imports only the layers below it, and the heavy libraries only where allowed.

    model <- policy <- pool <- {sim, runtime};  report <- {sim, runtime};  runtime <- integration <- entry points

``model``, ``policy``, ``pool`` and ``report`` are pure (stdlib + numpy, yaml for workload files, matplotlib for
plots); ``sim`` and ``runtime`` never import each other; ``runtime`` uses Ray and no verl; only ``integration``
imports verl, hydra, omegaconf, torch or transfer_queue.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "jigsaw_verl"
STDLIB = set(sys.stdlib_module_names)
HEAVY = {"verl", "torch", "ray", "hydra", "omegaconf", "transformers", "vllm", "sglang", "transfer_queue", "tensordict"}
# layer -> the jigsaw_verl layers it may import, and the third-party modules it may import
LAYERS = {
    "model": ({"model"}, {"numpy", "yaml"}),
    "policy": ({"model", "policy"}, {"numpy"}),
    "pool": ({"model", "policy", "pool"}, {"numpy"}),
    "report": ({"model", "policy", "pool", "report"}, {"numpy", "matplotlib"}),
    "sim": ({"model", "policy", "pool", "report", "sim"}, {"numpy", "yaml", "matplotlib"}),
    "runtime": ({"model", "policy", "pool", "report", "runtime"}, {"numpy", "ray"}),
    "integration": (
        {"model", "policy", "pool", "report", "runtime", "integration", "patches"},
        HEAVY
        | {
            "numpy",
            "yaml",
            "fastapi",
            "uvicorn",
            "cachetools",
            "pandas",
            "pyarrow",
            "datasets",
            "tokenizers",
            "huggingface_hub",
        },
    ),
}
PURE = ("model", "policy", "pool", "sim")  # files ~400 lines, functions ~60
MAX_FILE_LINES, MAX_FUNCTION_LINES = 420, 65


def _imports(path: Path) -> tuple[set[str], set[str]]:
    """(jigsaw_verl layers, other top-level modules) a file imports, anywhere in it."""
    layers, others = set(), set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.relative_to(PKG)}: relative import (use jigsaw_verl.<layer>...)"
            names = [node.module or ""]
        for name in names:
            parts = name.split(".")
            if parts[0] == "jigsaw_verl":
                layers.add(parts[1] if len(parts) > 1 else "")
            else:
                others.add(parts[0])
    return layers, others - STDLIB


def test_every_module_belongs_to_a_layer():
    top = {p.name for p in PKG.iterdir() if p.is_dir() and not p.name.startswith("_") and p.name != "workloads"}
    assert top - {"trainer"} == set(LAYERS), "jigsaw_verl/trainer is the public import-swap module only"


def test_no_layer_imports_a_layer_above_it():
    for layer, (allowed, third_party) in LAYERS.items():
        for f in sorted((PKG / layer).rglob("*.py")):
            layers, others = _imports(f)
            assert layers <= allowed, f"{f.relative_to(PKG)} imports jigsaw_verl.{sorted(layers - allowed)}"
            assert others <= third_party, f"{f.relative_to(PKG)} imports {sorted(others - third_party)}"


def test_sim_and_runtime_never_import_each_other():
    for a, b in (("sim", "runtime"), ("runtime", "sim")):
        for f in sorted((PKG / a).rglob("*.py")):
            assert b not in _imports(f)[0], f"{f.relative_to(PKG)} imports jigsaw_verl.{b}"


def test_files_and_functions_stay_readable():
    for layer in PURE:
        for f in sorted((PKG / layer).rglob("*.py")):
            text = f.read_text()
            assert len(text.splitlines()) <= MAX_FILE_LINES, f"{f.relative_to(PKG)}: {len(text.splitlines())} lines"
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    n = node.end_lineno - node.lineno + 1
                    assert n <= MAX_FUNCTION_LINES, f"{f.relative_to(PKG)}:{node.name}: {n} lines"


def test_importing_the_pure_layers_and_the_runner_loads_no_heavy_module():
    code = (
        "import sys, jigsaw_verl.model.graph, jigsaw_verl.policy.registry, jigsaw_verl.pool.snapshot,"
        " jigsaw_verl.sim.runner, jigsaw_verl.report.trace, jigsaw_verl.cli;"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {sorted(HEAVY)!r}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
