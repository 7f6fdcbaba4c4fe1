"""jigsaw-verl: JigsawRL pipeline multiplexing as a plugin for verl."""

from setuptools import find_packages, setup

# verl 0.9.1 imports these without declaring them (rollout router, V1 task runner, rollout server).
VERL_UNDECLARED = [
    "cachetools>=5",
    "TransferQueue==0.1.11",
    "fastapi",
    "uvicorn",
    "pyzmq",
    "msgspec",
]

setup(
    name="jigsaw-verl",
    version="0.1.0",
    description="Pipeline multiplexing (JigsawRL) for verl recipes: sub-stage graphs, a look-ahead scheduler, "
    "rollout migration and a cluster simulator.",
    # The repository's top-level patches/ folder is installed as jigsaw_verl.patches (not a generic `patches`).
    packages=[*find_packages(include=["jigsaw_verl", "jigsaw_verl.*"]), "jigsaw_verl.patches"],
    package_dir={"jigsaw_verl.patches": "patches"},
    package_data={
        "jigsaw_verl": ["workloads/*.yaml", "workloads/*.md"],
        "jigsaw_verl.integration": ["config/*.yaml"],
        "jigsaw_verl.patches": ["README.md"],
    },
    python_requires=">=3.10",
    install_requires=[
        "verl==0.9.1",
        # Ranges here; the exact versions come from a constraints file: constraints.txt on CPU machines (torch
        # 2.13.0 CPU build), constraints-gpu.txt on GPU hosts (verl 0.9.1's tested vLLM set, torch 2.11.0).
        "torch>=2.11.0,<2.14",
        "ray==2.60.0",
        "hydra-core==1.3.8",
        "numpy>=2.0,<2.5",
        "transformers>=5.9.0,<5.11,!=5.6.0",
        "tensordict==0.10.0",
        "pyyaml>=6",
        "matplotlib>=3.8",
        *VERL_UNDECLARED,
    ],
    extras_require={
        # verl's vLLM rollout on GPU machines (the version verl 0.9.1 tests; install with constraints-gpu.txt).
        "gpu": ["vllm==0.24.0"],
        "dev": ["pytest>=8", "hypothesis>=6", "ruff>=0.6"],
    },
    entry_points={
        "console_scripts": ["jigsaw-verl=jigsaw_verl.cli:main"],
        # verl imports these in every process: registrations only (CPU platform, rollout, engines, patches).
        "verl.plugins": ["jigsaw_cpu = jigsaw_verl.integration.cpu.plugin"],
    },
)
