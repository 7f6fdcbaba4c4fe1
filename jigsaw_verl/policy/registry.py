"""The policy registry: every name ``jigsaw-verl simulate --policies`` and ``jigsaw.mux.policy`` accept.

Each :class:`PolicyEntry` builds, from a workload, the configurations worth trying (the runner simulates each and
reports the best) and says which :data:`~jigsaw_verl.policy.interface.EXECUTION_FEATURES` they use, so an executor
can tell which policies it can run (:func:`policies_needing_at_most`). ``greedy`` and ``jigsaw`` are the JigsawRL
scheduler (:mod:`jigsaw_verl.policy.jigsaw.lookahead`); the ablations ``jigsaw-no-migration``,
``jigsaw-no-colocation`` and ``jigsaw-no-elastic-tail`` switch one mechanism off; ``jigsaw-wide-start`` switches
the (off by default) wide start on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from jigsaw_verl.model.spec import WorkloadSpec
from jigsaw_verl.policy.baselines.areal import areal
from jigsaw_verl.policy.baselines.placement import SplitSearch
from jigsaw_verl.policy.baselines.rollmux import rollmux
from jigsaw_verl.policy.baselines.streamrl import streamrl
from jigsaw_verl.policy.baselines.verl import verl, verl_seq, verl_split
from jigsaw_verl.policy.interface import Policy
from jigsaw_verl.policy.jigsaw.knobs import JigsawKnobs
from jigsaw_verl.policy.jigsaw.lookahead import LookAheadPolicy

T = TypeVar("T")


class Registry(Generic[T]):
    """Named items of one kind.

    ``@REG.register("name")`` adds one; registering a different object under a taken name raises; looking up an
    unknown name raises ``KeyError`` listing what exists.
    """

    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            if name in self._items and self._items[name] is not obj:
                raise ValueError(f"{self.kind} {name!r} is already registered to {self._items[name]!r}")
            self._items[name] = obj
            return obj

        return deco

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except KeyError:
            raise KeyError(f"unknown {self.kind} {name!r}; known: {', '.join(sorted(self._items))}") from None

    def names(self) -> list[str]:
        return list(self._items)

    def __contains__(self, name: str) -> bool:
        return name in self._items


@dataclass(frozen=True, kw_only=True)
class PolicyEntry:
    """One registered policy.

    Attributes:
        name: its registry name.
        build: ``build(workload, *, split_search=None)`` -> the configurations to try on ``workload`` (empty when
            none is feasible); policies that pick a split by simulation raise ``ValueError`` without a
            ``split_search``, the others ignore it.
        needs: the execution features every configuration uses, whatever the workload.
        description: one line for listings.
        ordered: its configurations vary one quantity in order (RollMux: the rollout pool's size), so an executor
            may search them for the fastest rather than run every one (the simulator's pruned search).
    """

    name: str
    build: Callable[..., list[Policy]]
    needs: frozenset[str]
    description: str
    ordered: bool = False


POLICIES: Registry[PolicyEntry] = Registry("policy")


def _add(name: str, build: Callable[..., list[Policy]], description: str, *needs: str, ordered: bool = False) -> None:
    entry = PolicyEntry(name=name, build=build, needs=frozenset(needs), description=description, ordered=ordered)
    POLICIES.register(name)(entry)


def _workload_only(factory: Callable[[WorkloadSpec], list[Policy]]) -> Callable[..., list[Policy]]:
    """``factory`` with the registry's calling convention (it needs no split search)."""

    def build(workload: WorkloadSpec, *, split_search: SplitSearch | None = None) -> list[Policy]:
        return factory(workload)

    return build


def _jigsaw(name: str, **knobs) -> Callable[..., list[Policy]]:
    def build(workload: WorkloadSpec, *, split_search: SplitSearch | None = None) -> list[Policy]:
        return [LookAheadPolicy(workload, JigsawKnobs(**knobs), name=name)]

    return build


_add("verl", _workload_only(verl), "stock verl: the faster of verl-seq and verl-split")
_add("verl-seq", _workload_only(verl_seq), "stock verl, one job after another on the whole pool")
_add("verl-split", _workload_only(verl_split), "stock verl, the pool cut into equal static slices")
_add("streamrl", streamrl, "StreamRL-style: disaggregated, streamed, one step off-policy", "staleness", "streaming")
_add(
    "areal",
    areal,
    "AReaL-style: disaggregated, fully asynchronous, interruptible rollouts",
    "staleness",
    "overlapping",
    "interruptible",
)
_add(
    "rollmux",
    _workload_only(rollmux),
    "RollMux-style: phase round-robin over a rollout and a training pool",
    ordered=True,
)
# NOTE: jigsaw keeps each pipeline's declared mode: only pipelines declared async use staleness (with AReaL's
# overlapping, interruptible rollouts), so no feature is needed whatever the workload; the live executor checks
# each joined pipeline's mode (verl's sync trainer: none).
_add("greedy", _jigsaw("greedy", horizon=0, migration=False), "JigsawRL first-fit with co-location, no look-ahead")
_add("jigsaw", _jigsaw("jigsaw"), "JigsawRL: look-ahead, tail migration and co-location")
_add("jigsaw-no-migration", _jigsaw("jigsaw-no-migration", migration=False), "jigsaw without tail migration")
_add("jigsaw-no-colocation", _jigsaw("jigsaw-no-colocation", colocation=False), "jigsaw without co-location")
_add(
    "jigsaw-no-elastic-tail",
    _jigsaw("jigsaw-no-elastic-tail", elastic_tail=False),
    "jigsaw without tail moves onto wider replicas (pipelines with rollout_elastic_tp)",
)

_add(
    "jigsaw-wide-start",
    _jigsaw("jigsaw-wide-start", wide_start=True),
    "jigsaw that may also start a rollout on the whole free pool rather than its fair share",
)

BASELINES: tuple[str, ...] = ("verl", "verl-seq", "verl-split", "streamrl", "areal", "rollmux")


def policies_needing_at_most(features: frozenset[str]) -> list[str]:
    """Names of the registered policies whose ``needs`` are within ``features``, in registry order."""
    return [name for name in POLICIES.names() if POLICIES.get(name).needs <= features]
