"""One multiplexed run on a Ray cluster of three nodes of one CPU slot each, and a node killed in the middle of it.

Run as ``python multi_node_mux.py OUT`` (a process of its own: the cluster's driver). It starts the cluster
(:mod:`multi_node_cluster`: a head for the drivers and trainers, three worker nodes whose CPUs are exactly one pool
slot's bundle each), runs ``jigsaw-verl mux`` on it through ``RAY_ADDRESS`` with a pool of 3 nodes x 1 slot and three
pipelines:

- ``a``: the bundled recipe (seed 7) over two nodes (``trainer.nnodes=2 trainer.n_gpus_per_node=1``);
- ``b``: the verl-style script over two nodes;
- ``c``: the bundled recipe (seed 11, as ``b`` of :mod:`tiny_pipelines`) on one slot;

then, once ``b`` runs its first rollout, kills the raylet of the pool node that only ``b`` lives on (the pool rule
places ``a`` on nodes 0-1, ``b`` on 1-2, ``c`` on 0), waits for the scheduler to report the node lost and for the
launcher, and writes ``OUT/multi_node.json``: the launcher's exit code, which pool node and Ray node was killed,
how soon the scheduler noticed and which pipelines were still in the group then.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from multi_node_cluster import ray_cluster  # noqa: E402
from tiny_pipelines import RECIPE, STEPS, env, overrides  # noqa: E402
from verl_style import VERL_STYLE, cpu_size_overrides  # noqa: E402

GROUP = "multinode"
NAMES = ("p0-cpu_tiny_grpo", "p1-verl_style_grpo", "p2-cpu_tiny_grpo")
TWO_NODES = ["trainer.nnodes=2", "trainer.n_gpus_per_node=1"]
# the CPU backend's slot bundle is {"CPU": 2}: a worker node of 2 CPUs holds its slot and nothing else
SLOT_CPUS = 2


def recipes(out: Path) -> list[str]:
    a = [str(RECIPE), f"trainer.total_training_steps={STEPS}", *overrides("a", out), *TWO_NODES]
    b = [
        str(VERL_STYLE),
        *cpu_size_overrides(),
        "actor_rollout_ref.rollout.seed=11",
        f"trainer.rollout_data_dir={out / 'b' / 'rollouts'}",
        "trainer.logger=[console,file]",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
        *TWO_NODES,
    ]
    c = [
        str(RECIPE),
        f"trainer.total_training_steps={STEPS}",
        "trainer.logger=[console,file]",
        "actor_rollout_ref.rollout.seed=11",
        f"trainer.rollout_data_dir={out / 'c' / 'rollouts'}",
        "trainer.n_gpus_per_node=1",
    ]
    return [" ".join(r) for r in (a, b, c)]


def group_status(launcher: subprocess.Popen, until) -> dict | None:
    """Poll the group's scheduler until ``until(status)`` holds (``None``: the launcher ended first)."""
    import ray

    while launcher.poll() is None:
        try:
            scheduler = ray.get_actor(f"jigsaw-mux-{GROUP}", namespace="jigsaw_mux")
            status = ray.get(scheduler.status.remote(), timeout=10)
        except (ValueError, ray.exceptions.GetTimeoutError):  # not created yet, or busy
            status = None
        if status is not None and until(status):
            return status
        time.sleep(0.2)
    return None


def kill_b_node(nodes, launcher: subprocess.Popen) -> dict:
    """Once b runs its first rollout (the others are then mid-run too: c starts with b, a before): kill the raylet
    of the pool node that only b lives on, then wait for the group's scheduler to report the node lost."""
    import ray

    b = NAMES[1]
    started = group_status(launcher, lambda s: "rollout of step 0" in s["pipelines"].get(b, {}).get("running", []))
    if started is None:
        return {"killed": None}
    scheduler = ray.get_actor(f"jigsaw-mux-{GROUP}", namespace="jigsaw_mux")
    pool = ray.get(scheduler.placement.remote())
    others = {g for name, home in pool["homes"].items() if name != b for g in home}
    (victim,) = [n for n in pool["nodes"] if not others & set(n["slots"])]
    k = pool["nodes"].index(victim)
    next(n for n in nodes if n.node_id == victim["node_id"]).kill_raylet()
    killed_at = time.monotonic()
    lost = group_status(launcher, lambda s: k in s["lost_nodes"])
    return {
        "killed": {"pool_node": k, "node_id": victim["node_id"], "b_steps_done": started["pipelines"][b]["steps_done"]},
        "noticed_after_s": None if lost is None else time.monotonic() - killed_at,
        # who was still in the group when the scheduler took the node out
        "in_group_at_loss": None if lost is None else sorted(lost["pipelines"]),
    }


def main(out: Path) -> None:
    import ray

    out.mkdir(parents=True, exist_ok=True)
    workers = [{"num_cpus": SLOT_CPUS} for _ in range(3)]
    # the head runs the launcher, the scheduler, each pipeline's driver and trainer (16 logical CPUs a pipeline)
    with ray_cluster(head_cpus=16 * 3, workers=workers) as (cluster, nodes):
        ray.init(address=cluster.address, log_to_driver=False)
        log = (out / "mux.log").open("w")
        args = [sys.executable, "-m", "jigsaw_verl.cli", "mux", *recipes(out), "--out", str(out), "--group", GROUP,
                "--pool-slots", "3", "--pool-nodes", "3"]  # fmt: skip
        launcher = subprocess.Popen(args, env=env(RAY_ADDRESS=cluster.address), stdout=log, stderr=subprocess.STDOUT)
        found = kill_b_node(nodes, launcher)
        found["rc"] = launcher.wait(timeout=1500)
        log.close()
    (out / "multi_node.json").write_text(json.dumps(found, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
