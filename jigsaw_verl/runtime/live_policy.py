"""Which policies the live runtime can run, and the factory it builds the group's policy with.

The live runtime runs verl's synchronous trainer: on-policy steps, stage by stage. A registered policy that needs
asynchronous execution (:data:`~jigsaw_verl.policy.interface.EXECUTION_FEATURES`: staleness, streaming,
overlapping or interruptible rollouts) is refused with one line naming ``jigsaw.mux.policy`` and the policies it
can run.
"""

from __future__ import annotations

from collections.abc import Callable

from jigsaw_verl.model.spec import WorkloadSpec
from jigsaw_verl.policy.interface import Policy
from jigsaw_verl.policy.registry import POLICIES, PolicyEntry, policies_needing_at_most
from jigsaw_verl.runtime.leases import PolicyRefused

# what the live executor can run beyond on-policy synchronous steps: nothing yet
LIVE_FEATURES: frozenset[str] = frozenset()


def live_policy_names() -> list[str]:
    """The registered policies the live runtime can run, in registry order."""
    return policies_needing_at_most(LIVE_FEATURES)


def check_live_policy(name: str) -> PolicyEntry:
    """The registry entry of ``name``; raises :class:`PolicyRefused` (one line naming ``jigsaw.mux.policy``) for an
    unknown policy or one the live runtime cannot run. The entry point runs this before Ray, the executor at join."""
    runnable = ", ".join(live_policy_names())
    try:
        entry = POLICIES.get(name)
    except KeyError:
        known = ", ".join(sorted(POLICIES.names()))
        raise PolicyRefused(
            f"jigsaw.mux.policy={name!r} is unknown (known: {known}); the live runtime can run: {runnable}"
        ) from None
    needs = entry.needs - LIVE_FEATURES
    if needs:
        raise PolicyRefused(
            f"jigsaw.mux.policy={name!r} needs asynchronous execution ({', '.join(sorted(needs))}), which the live "
            f"runtime does not run yet; it can run: {runnable}"
        )
    return entry


def live_policy_factory(name: str) -> Callable[[WorkloadSpec], Policy]:
    """The factory of ``name``'s first configuration, after :func:`check_live_policy`."""
    entry = check_live_policy(name)

    def build(workload: WorkloadSpec) -> Policy:
        configurations = entry.build(workload)
        if not configurations:
            raise PolicyRefused(f"jigsaw.mux.policy={name!r} has no configuration for the pipelines joined")
        return configurations[0]

    return build
