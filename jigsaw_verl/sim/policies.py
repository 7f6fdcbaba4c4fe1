"""The policy registry: every name ``jigsaw-verl simulate --policies`` accepts.

Each entry maps a workload to the configurations worth trying; the runner simulates each and reports the best.
``greedy`` and ``jigsaw`` are reserved for the JigsawRL scheduler.
"""

from __future__ import annotations

from ..core.registry import Registry
from ..core.scheduling import PolicyFactory
from .baselines.areal import areal
from .baselines.rollmux import rollmux
from .baselines.streamrl import streamrl
from .baselines.verl import verl, verl_seq, verl_split

POLICIES: Registry[PolicyFactory] = Registry("policy")
RESERVED = ("greedy", "jigsaw")

POLICIES.register("verl")(verl)
POLICIES.register("verl-seq")(verl_seq)
POLICIES.register("verl-split")(verl_split)
POLICIES.register("streamrl")(streamrl)
POLICIES.register("areal")(areal)
POLICIES.register("rollmux")(rollmux)

BASELINES: tuple[str, ...] = ("verl", "verl-seq", "verl-split", "streamrl", "areal", "rollmux")
