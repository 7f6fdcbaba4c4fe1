"""Pool slots pinned to cores on the CPU backend (``jigsaw.mux.pin_cores``): which cores a slot gets, and that
pinning confines every thread of a process."""

from __future__ import annotations

import subprocess
import sys

import pytest

from jigsaw_verl.integration.cpu.slot_cores import MACHINE_CORES, slot_cores


def test_each_slot_of_a_node_gets_its_own_cores_and_slots_wrap_round_when_cores_are_few():
    assert [slot_cores(g, 2, (0, 1)) for g in range(2)] == [(0,), (1,)]
    assert [slot_cores(g, 2, (0, 1, 2, 3)) for g in range(2)] == [(0, 1), (2, 3)]
    assert [slot_cores(g, 2, (4, 5, 6, 7, 8)) for g in range(2)] == [(4, 5), (6, 7)]  # the spare core is left out
    # more slots than cores: slots share cores round the machine (the README says what that models)
    assert [slot_cores(g, 4, (0, 1)) for g in range(4)] == [(0,), (1,), (0,), (1,)]
    # global slots: two-slot nodes of the test cluster (several Ray nodes on one machine) take different cores
    assert [slot_cores(g, 2, (0, 1, 2, 3)) for g in range(4)] == [(0, 1), (2, 3), (0, 1), (2, 3)]
    assert [slot_cores(g, 1, (0, 1, 2)) for g in range(3)] == [(0, 1, 2)] * 3  # one slot a node: the node's cores


@pytest.mark.parametrize("slot, per_node", [(-1, 2), (0, 0)])
def test_a_slot_that_cannot_exist_is_refused(slot, per_node):
    with pytest.raises(ValueError, match="no such slot"):
        slot_cores(slot, per_node, (0, 1))


def test_pinning_confines_every_thread_of_the_process_and_torch_takes_one_thread_per_core():
    core = MACHINE_CORES[-1]
    script = f"""
import os, threading, time, torch
from jigsaw_verl.integration.cpu.slot_cores import pin_process
started = threading.Event()
t = threading.Thread(target=lambda: (started.set(), time.sleep(5)), daemon=True)
t.start(); started.wait()
pin_process(({core},))
masks = {{tid: sorted(os.sched_getaffinity(int(tid))) for tid in os.listdir("/proc/self/task")}}
later = []
u = threading.Thread(target=lambda: later.append(sorted(os.sched_getaffinity(0))))
u.start(); u.join()
print(len(masks), all(m == [{core}] for m in masks.values()), later == [[{core}]], torch.get_num_threads())
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    threads, all_pinned, new_pinned, torch_threads = out.stdout.split()
    assert int(threads) >= 2 and all_pinned == "True" and new_pinned == "True" and torch_threads == "1", out.stdout
