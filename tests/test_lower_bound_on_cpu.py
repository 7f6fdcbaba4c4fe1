"""The lower bound: no policy and no brute-force schedule beats it, on random small instances."""

from __future__ import annotations

import itertools

from conftest import TINY_MODEL
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from schedule_checks import check_all
from test_simulator_on_cpu import configurations

from jigsaw_verl.model.graph import ROLLOUT
from jigsaw_verl.model.memory import min_train_gpus
from jigsaw_verl.model.spec import SpecError, WorkloadSpec, workload_from_dict
from jigsaw_verl.model.workload_file import bundled_workloads, load_workload
from jigsaw_verl.policy.interface import ExecutionMode, SchedulerOutput, Snapshot, StartStage, WidenTail
from jigsaw_verl.policy.registry import BASELINES
from jigsaw_verl.sim.lower_bound import declared_staleness, lower_bound, rollout_tps
from jigsaw_verl.sim.simulator import Simulator

BRUTE_FORCE_LEAVES = 120


class ScriptedPolicy:
    """Brute force: at decision i take option ``script[i]`` (0 past the script) among every way to start one
        ready stage on any subset of the free GPUs, to move a tail onto any wider replica its pipeline allows
    (:class:`WidenTail`), or to wait, when something is running; records how many
        options each decision had, so a search can enumerate the tree. On-policy, every pipeline as declared."""

    name = "brute-force"
    detailed_snapshot = True  # it reads the live replicas for tail moves

    def __init__(self, w: WorkloadSpec, script: list[int]):
        self.w, self.script, self.counts = w, script, []
        self.config = "script " + ",".join(map(str, script))
        self.spec = {p.name: p for p in w.pipelines}
        self.modes = {p.name: ExecutionMode(staleness=declared_staleness(w)[p.name]) for p in w.pipelines}

    def mode(self, pipeline):
        return self.modes[pipeline]

    def _options(self, snap: Snapshot) -> list[StartStage | WidenTail | None]:
        busy = len(snap.free_gpus) < snap.num_gpus or not all(v.arrived for v in snap.pipelines)
        opts: list[StartStage | WidenTail | None] = [None] if busy else []
        opts += self._tail_moves(snap)
        free = sorted(snap.free_gpus)
        for r in snap.ready:
            p = self.spec[r.pipeline]
            need = (
                p.rollout_tp
                if r.stage == ROLLOUT
                else min_train_gpus(p.model, self.w.cluster.gpu, critic=p.critic, ref_model=p.ref_model)
            )
            for n in range(1, len(free) + 1):
                if n < need or (r.stage == ROLLOUT and n % p.rollout_tp):
                    continue
                opts += [StartStage(r.pipeline, r.step, r.stage, c) for c in itertools.combinations(free, n)]
        return opts

    def _tail_moves(self, snap: Snapshot) -> list[WidenTail]:
        """Every move of a pipeline's whole tail (nothing queued) onto one wider replica of its own and free GPUs
        on one node, at each TP its ``rollout_elastic_tp`` allows."""
        moves, gpn = [], self.w.cluster.gpus_per_node
        for name, p in self.spec.items():
            reps = [r for r in snap.replicas if r.pipeline == name]
            if not reps or any(r.queued for r in reps) or not p.rollout_elastic_tp:
                continue
            usable = {g for r in reps for g in r.gpus} | set(snap.free_gpus)
            for tp in rollout_tps(p):
                if tp <= max(len(r.gpus) for r in reps):
                    continue
                for block in itertools.combinations(sorted(usable), tp):
                    if len({g // gpn for g in block}) == 1:
                        moves.append(WidenTail(name, tuple(r.replica for r in reps), block))
        return moves

    def schedule(self, snap: Snapshot) -> SchedulerOutput:
        opts = self._options(snap)
        if not opts:
            return SchedulerOutput()
        i = len(self.counts)
        self.counts.append(len(opts))
        pick = opts[self.script[i] if i < len(self.script) else 0]
        return SchedulerOutput(() if pick is None else (pick,))


def brute_force(w: WorkloadSpec, leaves: int = BRUTE_FORCE_LEAVES):
    """Depth-first over decision scripts; yields each schedule's result (at most ``leaves``)."""
    stack = [[]]
    while stack and leaves > 0:
        script = stack.pop()
        policy = ScriptedPolicy(w, script)
        yield Simulator(w, policy).run()
        leaves -= 1
        for i in range(len(policy.counts) - 1, len(script) - 1, -1):
            for alt in range(policy.counts[i] - 1, 0, -1):
                stack.append(script + [0] * (i - len(script)) + [alt])


@st.composite
def small_workloads(draw):
    n_pipes = draw(st.integers(1, 2))
    n = draw(st.integers(1, 3))
    pipes = []
    for i in range(n_pipes):
        median = draw(st.integers(5, 300))
        mode = draw(st.sampled_from(["sync", "async"]))
        p = {
            "name": f"p{i}",
            "model": dict(TINY_MODEL, params_b=draw(st.sampled_from([0.2, 1.0, 3.0]))),
            "algorithm": draw(st.sampled_from(["grpo", "ppo"])),
            "mode": mode,
            "batch_prompts": draw(st.integers(1, 3)),
            "group_size": draw(st.integers(1, 3)),
            "prompt_len": {"median": draw(st.integers(5, 100)), "p99": 200, "max": 256},
            "response_len": {
                "median": median,
                "p99": median * draw(st.integers(1, 12)),
                "max": 4096,
                "group_corr": draw(st.sampled_from([0.0, 0.7])),
            },
            "ref_model": draw(st.booleans()),
            "train_micro_batch_tokens": 4352,
            "param_offload": draw(st.booleans()),
            "optimizer_offload": draw(st.booleans()),
            "gpu_memory_utilization": draw(st.sampled_from([None, 0.1, 0.5])),
            "steps": draw(st.integers(1, 3)),
            "arrival_s": draw(st.sampled_from([0.0, 0.0, 2.5])),
            # tails may move onto a TP-2 replica where the pool is one 2-GPU node
            "rollout_elastic_tp": draw(st.sampled_from([None, 2])) if n == 2 else None,
        }
        if mode == "async":
            p["max_staleness"] = draw(st.integers(1, 2))
        pipes.append(p)
    try:
        return workload_from_dict(
            {
                "name": "random",
                "seed": draw(st.integers(0, 99)),
                "cluster": {"gpu": "H100-80G", "num_gpus": n},
                "pipelines": pipes,
            }
        )
    except SpecError:  # e.g. a 3B PPO job on one GPU: not a valid instance
        assume(False)


def _assert_above_bound(w, r):
    declared = declared_staleness(w)
    bound = lower_bound(w, staleness={k: max(v, r.staleness[k]) for k, v in declared.items()})
    assert r.makespan_s >= bound.makespan_s * (1 - 1e-9), (r.policy, r.config, r.makespan_s, bound)


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(small_workloads())
def test_no_policy_beats_the_bound(w):
    for name in (*BASELINES, "greedy", "jigsaw"):
        for c in configurations(name, w):
            r = Simulator(w, c).run()
            check_all(w, r)
            _assert_above_bound(w, r)


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(small_workloads())
def test_no_brute_force_schedule_beats_the_bound(w):
    bound = lower_bound(w).makespan_s
    seen = 0
    for r in brute_force(w):
        check_all(w, r)
        assert r.makespan_s >= bound * (1 - 1e-9), (r.config, r.makespan_s, bound)
        seen += 1
    assert seen >= 1


def test_brute_force_enumerates_distinct_schedules():
    w = workload_from_dict(
        {
            "name": "two",
            "cluster": {"gpu": "H100-80G", "num_gpus": 2},
            "pipelines": [
                {
                    "name": "a",
                    "model": TINY_MODEL,
                    "batch_prompts": 1,
                    "group_size": 2,
                    "steps": 1,
                    "prompt_len": {"median": 20, "p99": 30, "max": 64},
                    "response_len": {"median": 50, "p99": 80, "max": 128},
                },
                {
                    "name": "b",
                    "model": TINY_MODEL,
                    "batch_prompts": 1,
                    "group_size": 1,
                    "steps": 1,
                    "prompt_len": {"median": 20, "p99": 30, "max": 64},
                    "response_len": {"median": 500, "p99": 800, "max": 1024},
                },
            ],
        }
    )
    makespans = {round(r.makespan_s, 9) for r in brute_force(w, leaves=400)}
    assert len(makespans) > 10


def test_bundled_workloads_respect_the_bound():
    for f in bundled_workloads():
        w = load_workload(f)
        for c in configurations("verl", w):
            _assert_above_bound(w, Simulator(w, c).run())


def test_bound_is_tight_where_a_schedule_can_reach_it():
    """One long response alone on one GPU: the only slack is the fixed costs the bound leaves out (initial
    onload, reward, micro-batch overheads, the log-prob pass the bound lets overlap the rollout)."""
    w = workload_from_dict(
        {
            "name": "one",
            "cluster": {"gpu": "H100-80G", "num_gpus": 1},
            "pipelines": [
                {
                    "name": "a",
                    "model": TINY_MODEL,
                    "batch_prompts": 1,
                    "group_size": 1,
                    "steps": 1,
                    "ref_model": False,
                    "prompt_len": {"median": 100, "p99": 100, "max": 128},
                    "response_len": {"median": 4000, "p99": 4000, "max": 4096},
                }
            ],
        }
    )
    (c,) = configurations("verl-seq", w)
    makespan, bound = Simulator(w, c).run().makespan_s, lower_bound(w).makespan_s
    assert bound <= makespan < 1.1 * bound
