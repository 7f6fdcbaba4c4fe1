"""Validity checks of a simulated schedule, shared by the simulator and lower-bound tests."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from jigsaw_verl.model.graph import LOGPROB, ROLLOUT, UPDATE, WEIGHT_SYNC
from jigsaw_verl.model.lengths import sample_steps
from jigsaw_verl.model.spec import WorkloadSpec
from jigsaw_verl.sim.simulator import SimResult

EPS = 1e-7


def check_tokens_exactly_once(w: WorkloadSpec, r: SimResult) -> None:
    for p in w.pipelines:
        for k, s in enumerate(sample_steps(p, w.seed)):
            np.testing.assert_array_equal(r.generated[p.name][k], s.response_len, err_msg=f"{r.policy} {p.name} {k}")
            assert (r.completions[p.name][k] == 1).all(), f"{r.policy}: {p.name} step {k} finished twice or never"


def check_no_gpu_oversubscribed(r: SimResult) -> None:
    """At no time do the SM shares leased on a GPU sum above 1 (exclusive slices count 1: no overlap at all)."""
    per_gpu = defaultdict(list)
    for s in r.slices:
        for i, g in enumerate(s.gpus):
            share = s.sm_shares[i] if s.sm_shares else 1.0
            per_gpu[g].append((s.start_s, share, s.pipeline, s.stage))
            per_gpu[g].append((s.end_s - EPS, -share, s.pipeline, s.stage))
    for g, events in per_gpu.items():
        events.sort(key=lambda e: (e[0], e[1]))  # ends (negative) before starts at the same instant
        used = 0.0
        for t, d, p, st in events:
            used += d
            assert used <= 1.0 + 1e-6, f"{r.policy}: GPU {g} is leased {used:.3f} of its SMs at t={t:.3f} ({p} {st})"
        assert max(t for t, _, _, _ in events) <= r.makespan_s + EPS


def check_migrations(w: WorkloadSpec, r: SimResult) -> None:
    """Sources and targets of every merge are disjoint, each GPU appears once per migration, and a tail move's
    one replica is as wide as its GPUs, on one node."""
    for m in r.migrations:
        if m.wide_tp:
            assert len(m.targets) == m.wide_tp == len(set(m.targets)), m
            assert len({g // w.cluster.gpus_per_node for g in m.targets}) == 1, m
        else:
            assert not set(m.sources) & set(m.targets), m
        assert len(set(m.sources)) == len(m.sources) and m.requests >= 0


def check_dependencies(w: WorkloadSpec, r: SimResult) -> None:
    st = {(s.pipeline, s.step, s.stage): s for s in r.stages}
    for p in w.pipelines:
        s_max = r.staleness[p.name]
        assert st[(p.name, 0, ROLLOUT)].start_s >= p.arrival_s - EPS
        for k in range(p.steps):
            roll, lp, up = (st[(p.name, k, x)] for x in (ROLLOUT, LOGPROB, UPDATE))
            assert up.start_s >= lp.end_s - EPS and up.start_s >= roll.end_s - EPS
            assert lp.end_s >= roll.end_s - EPS
            if k:
                assert lp.start_s >= st[(p.name, k - 1, UPDATE)].end_s - EPS
            if k - 1 - s_max >= 0:  # rollout k needs weights of version k - staleness
                assert roll.start_s >= st[(p.name, k - 1 - s_max, WEIGHT_SYNC)].end_s - EPS
            if lp.start_s < roll.end_s - EPS:  # streamed: each log-prob micro-batch after its samples
                mbs = [
                    s
                    for s in r.slices
                    if (s.pipeline, s.step, s.stage) == (p.name, k, LOGPROB) and s.inputs_ready_s is not None
                ]
                assert mbs, f"{r.policy}: {p.name} log-prob {k} began before its rollout ended without streaming"
                assert all(s.start_s >= s.inputs_ready_s - EPS for s in mbs)
        assert r.finish_s[p.name] == st[(p.name, p.steps - 1, UPDATE)].end_s


def check_no_sync_beside_another_rollout(r: SimResult) -> None:
    """A weight sync wakes its pipeline's engines: it never shares a GPU with another pipeline's rollout (the live
    executor grants none there, ``LiveExecutor._may_share``)."""
    rollouts = defaultdict(list)
    for s in r.slices:
        if s.stage == ROLLOUT:
            for g in s.gpus:
                rollouts[g].append((s.start_s, s.end_s, s.pipeline))
    for s in r.slices:
        if s.stage != WEIGHT_SYNC:
            continue
        for g in s.gpus:
            beside = [x for x in rollouts[g] if x[2] != s.pipeline and x[0] < s.end_s - EPS and x[1] > s.start_s + EPS]
            assert not beside, f"{r.policy}: {s.pipeline} sync {s.step} on GPU {g} beside {beside[0][2]}'s rollout"


def check_all(w: WorkloadSpec, r: SimResult) -> None:
    check_tokens_exactly_once(w, r)
    check_no_gpu_oversubscribed(r)
    check_no_sync_beside_another_rollout(r)
    check_dependencies(w, r)
    check_migrations(w, r)
