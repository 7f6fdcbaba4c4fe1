"""Golden test: every policy on every bundled workload gives exactly the recorded result.

The record (``tests/golden/sim_results.json``, made by ``tests/golden_results.py --write``) pins makespans,
finish times, counts and a digest of every slice, stage, migration and token count, so a refactor of the
simulator, the policies or the pool mechanism cannot change a simulated figure unnoticed.
"""

from __future__ import annotations

import json

import pytest
from golden_results import GOLDEN, checked_records


@pytest.fixture(scope="module")
def checked() -> tuple[dict, list[str]]:
    return checked_records()  # every workload in a process of its own, over the machine's cores


@pytest.fixture(scope="module")
def computed(checked) -> dict:
    return checked[0]


def test_every_golden_schedule_is_valid(checked):
    """Each recorded run passes the schedule checks (dependencies, staleness, no GPU over-subscribed)."""
    assert checked[1] == []


def test_golden_file_covers_every_policy_and_workload(computed):
    golden = json.loads(GOLDEN.read_text())
    assert sorted(golden) == sorted(computed)
    for workload, policies in golden.items():
        assert sorted(policies) == sorted(computed[workload]), workload


def test_every_result_matches_the_golden_record(computed):
    golden = json.loads(GOLDEN.read_text())
    for workload, policies in golden.items():
        for policy, expected in policies.items():
            assert computed[workload][policy] == expected, f"{workload} / {policy}"
