"""The policy registry: every name ``jigsaw-verl simulate --policies`` accepts.

Each entry maps a workload to the configurations worth trying; the runner simulates each and reports the best.
``greedy`` and ``jigsaw`` are the JigsawRL scheduler (:mod:`jigsaw_verl.core.lookahead`); the ablations
``jigsaw-no-migration`` and ``jigsaw-no-colocation`` switch one mechanism off.
"""

from __future__ import annotations

from dataclasses import replace

from ..core.lookahead import JigsawConfig, LookAheadPolicy
from ..core.registry import Registry
from ..core.scheduling import Policy, PolicyFactory
from ..core.spec import WorkloadSpec
from .baselines.areal import areal
from .baselines.rollmux import rollmux
from .baselines.streamrl import streamrl
from .baselines.verl import verl, verl_seq, verl_split

POLICIES: Registry[PolicyFactory] = Registry("policy")

POLICIES.register("verl")(verl)
POLICIES.register("verl-seq")(verl_seq)
POLICIES.register("verl-split")(verl_split)
POLICIES.register("streamrl")(streamrl)
POLICIES.register("areal")(areal)
POLICIES.register("rollmux")(rollmux)


def _jigsaw(name: str, **over) -> PolicyFactory:
    def factory(workload: WorkloadSpec) -> list[Policy]:
        return [LookAheadPolicy(workload, replace(JigsawConfig(), **over), name=name)]

    return factory


POLICIES.register("greedy")(_jigsaw("greedy", horizon=0, migration=False))
POLICIES.register("jigsaw")(_jigsaw("jigsaw"))
POLICIES.register("jigsaw-no-migration")(_jigsaw("jigsaw-no-migration", migration=False))
POLICIES.register("jigsaw-no-colocation")(_jigsaw("jigsaw-no-colocation", colocation=False))

BASELINES: tuple[str, ...] = ("verl", "verl-seq", "verl-split", "streamrl", "areal", "rollmux")
