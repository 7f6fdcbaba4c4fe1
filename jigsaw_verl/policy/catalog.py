"""The policy registry: every name ``jigsaw-verl simulate --policies`` accepts.

Each entry maps a workload to the configurations worth trying; the runner simulates each and reports the best.
``greedy`` and ``jigsaw`` are the JigsawRL scheduler (:mod:`jigsaw_verl.policy.jigsaw.lookahead`); the ablations
``jigsaw-no-migration`` and ``jigsaw-no-colocation`` switch one mechanism off.
"""

from __future__ import annotations

from dataclasses import replace

from jigsaw_verl.model.spec import WorkloadSpec
from jigsaw_verl.policy.baselines.areal import areal
from jigsaw_verl.policy.baselines.rollmux import rollmux
from jigsaw_verl.policy.baselines.streamrl import streamrl
from jigsaw_verl.policy.baselines.verl import verl, verl_seq, verl_split
from jigsaw_verl.policy.interface import Policy, PolicyFactory
from jigsaw_verl.policy.jigsaw.lookahead import JigsawConfig, LookAheadPolicy
from jigsaw_verl.policy.registry import Registry

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
