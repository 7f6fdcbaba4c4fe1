"""When the tail monitor consolidates a rollout (pure decision logic; the mechanism is tested on real servers in
test_migration_on_cpu.py)."""

from __future__ import annotations

from jigsaw_verl.integration.rollout.migrator import MigrationReport
from jigsaw_verl.integration.rollout.tail_monitor import TailPolicy, freed_replica_seconds

P = TailPolicy(tail_threshold=4)


def test_no_migration_outside_the_tail():
    assert P.sources({"a": 5, "b": 1}, waiting=0) == []  # one replica still has a full batch
    assert P.sources({"a": 1, "b": 1}, waiting=3) == []  # requests still waiting to be admitted
    assert P.sources({"a": 0, "b": 0}, waiting=0) == []  # nothing left to move
    assert P.sources({"a": 2}, waiting=0) == []  # nowhere to move to


def test_keeps_enough_replicas_for_the_live_requests():
    live = {"a": 3, "b": 1, "c": 2, "d": 0}  # 6 live -> keep ceil(6/4) = 2 replicas, the fullest
    assert sorted(P.sources(live, waiting=0)) == ["b", "d"]
    assert P.sources({"a": 1, "b": 1}, waiting=0) == ["a"]  # ties broken by name: deterministic


def test_freed_replica_seconds():
    r = MigrationReport(sources=("a", "b"), targets=("c",), migrated_requests=3, reprefill_tokens=90, freed=True,
                        seconds=0.1, at_s=10.0)  # fmt: skip
    partial = MigrationReport(sources=("d",), targets=("c",), migrated_requests=1, reprefill_tokens=30, freed=False,
                              seconds=0.1, at_s=10.0)  # fmt: skip
    assert freed_replica_seconds([r], until_s=12.5) == 5.0
    assert freed_replica_seconds([r], until_s=9.0) == 0.0
    assert freed_replica_seconds([r, partial], until_s=12.5) == 5.0  # moving a subset frees no replica
