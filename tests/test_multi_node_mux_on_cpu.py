"""A multiplexing group on a Ray cluster of three nodes (``jigsaw-verl mux`` joining it by ``RAY_ADDRESS``), one of
which dies mid-run.

:mod:`multi_node_mux` runs the group (3 nodes x 1 CPU slot; pipeline a over nodes 0-1, b over 1-2, c on node 0,
by the pool's home rule) and kills node 2's raylet once b runs its first rollout. Every process is real: Ray's nodes,
verl's trainer, FSDP over two nodes, the CPU rollout replicas on their workers' nodes. One run serves every test
here (it takes minutes).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from multi_node_mux import NAMES
from tiny_pipelines import STEPS
from tiny_pipelines import rollouts as _rollouts
from tiny_pipelines import steps as _steps

HERE = Path(__file__).resolve().parent
A, B, C = NAMES


@pytest.fixture(scope="module")
def run(tmp_path_factory, alone_runs):
    out = tmp_path_factory.mktemp("multi_node")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    r = subprocess.run(
        [sys.executable, str(HERE / "multi_node_mux.py"), str(out)], env=env, capture_output=True, text=True,
        timeout=1800,
    )  # fmt: skip
    log = (out / "mux.log").read_text() if (out / "mux.log").exists() else ""
    assert r.returncode == 0, r.stderr[-3000:] + log[-3000:]
    found = json.loads((out / "multi_node.json").read_text())
    logs = {p.stem: p.read_text() for p in out.glob("p*.log")}
    return {"out": out, "found": found, "log": log, "logs": logs, "alone": alone_runs}


def _pool(run) -> dict:
    return json.loads((run["out"] / "pool.json").read_text())


def test_multi_node_every_worker_runs_in_its_nodes_placement_group_and_slot(run):
    pool = _pool(run)
    assert pool["slots_per_node"] == 1 and [n["slots"] for n in pool["nodes"]] == [[0], [1], [2]]
    assert len({n["node_id"] for n in pool["nodes"]}) == 3  # one placement group on each of three Ray nodes
    assert pool["homes"] == {A: [0, 1], B: [1, 2], C: [0]}
    for name, workers in pool["pipelines"].items():
        home = pool["homes"][name]
        assert len(workers) == len(home), (name, workers)
        for rank, w in enumerate(workers):  # verl's worker group lists its workers by rank
            node = pool["nodes"][home[rank]]
            assert (w["node_id"], w["placement_group_id"], w["bundle"]) == (
                node["node_id"],
                node["placement_group_id"],
                0,
            ), (name, rank, w)
    # a and b each span two nodes (FSDP over the NIC); a TP-1 rollout replica is one worker: never across nodes
    assert len({w["node_id"] for w in pool["pipelines"][A]}) == 2


def test_multi_node_pipelines_away_from_the_lost_node_finish_and_compute_what_they_compute_alone(run):
    assert f"exit codes {{'{A}': 0, '{B}': " in run["log"] and f"'{C}': 0}}" in run["log"]
    alone = _rollouts(run["alone"]["rollouts"]["a"])
    mux = _rollouts(run["out"] / "a" / "rollouts")
    assert sorted(mux) == sorted(alone) == list(range(1, STEPS + 1))
    for step in alone:  # two ranks on two nodes give what two ranks on one node give
        assert mux[step] == alone[step], f"a step {step}: responses or rewards differ"
    a, m = _steps(run["alone"]["metrics"]["a"]), _steps(run["out"] / f"{A}.metrics.jsonl")
    for step in range(1, STEPS + 1):
        assert m[step]["critic/score/mean"] == a[step]["critic/score/mean"]
    # c (seed 11, one slot) samples what b of the one-node test samples alone (seed 11, two slots): requests are
    # seeded one by one, and the canonical sample order makes its updates the same
    c, alone_c = _rollouts(run["out"] / "c" / "rollouts"), _rollouts(run["alone"]["rollouts"]["b"])
    assert sorted(c) == list(range(1, STEPS + 1)) and all(len(rows) == 8 * 4 for rows in c.values())
    for step in c:
        assert c[step] == alone_c[step], f"c step {step}: responses or rewards differ"


def test_multi_node_a_lost_node_ends_only_the_pipeline_living_there_and_its_leases_are_reclaimed(run):
    killed = run["found"]["killed"]
    pool = _pool(run)
    assert killed is not None and killed["pool_node"] == 2 and killed["b_steps_done"] == 0
    # noticed while c (and maybe a, which started first) still ran: the group went on without b
    assert run["found"]["noticed_after_s"] < 30 and C in run["found"]["in_group_at_loss"]
    assert B not in run["found"]["in_group_at_loss"]
    assert pool["lost_nodes"] == [2] and pool["nodes"][2]["node_id"] == killed["node_id"]
    # the launcher names the node (b fails by itself when its workers there die, or is stopped when it waits on them)
    assert f"mux: {B}: pool node 2 (Ray node {killed['node_id']}) left the cluster" in run["log"]
    assert f"'{B}': 0" not in run["log"]  # b failed; the others exit 0 (above)
    b_metrics = run["out"] / f"{B}.metrics.jsonl"
    assert not b_metrics.exists() or len(_steps(b_metrics)) < STEPS
    leases = json.loads((run["out"] / "leases.json").read_text())
    b_end = max(x["end_s"] for x in leases if x["pipeline"] == B)
    after = [x for x in leases if x["start_s"] > b_end]
    # the group went on without b (a, which started first, may have finished before b lost its node; c had not)
    assert after and {x["pipeline"] for x in after} <= {A, C}
    assert not any(2 in x["gpus"] for x in after)  # the lost node's slot is never handed out again
    assert not any(x.get("running") for x in leases)  # no lease left open: b's were reclaimed
    for slot in range(3):
        mine = [x for x in leases if slot in x["gpus"]]
        for t in sorted({x["start_s"] for x in mine}):
            held = sum(x["sm_share"] for x in mine if x["start_s"] <= t < x["end_s"])
            assert held <= 1.0 + 1e-9, f"slot {slot} oversubscribed at {t:.2f} s: {held}"
