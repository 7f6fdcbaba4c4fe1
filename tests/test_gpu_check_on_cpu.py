"""The prepared GPU check (``scripts/gpu_check.py``) in its reduced CPU form: two real processes, the residency
figures (on the CPU the freed bytes are the state's size, said so), both loops' speeds alone and time-sliced, and a
file the interference table's loader reads (no MPS here, so no shares)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from jigsaw_verl.policy.jigsaw.interference import FORMAT, InterferenceTable

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "gpu_check.py"


def test_gpu_check_reduced_on_the_cpu_writes_residency_speeds_and_a_loadable_table(tmp_path):
    out = tmp_path / "check.json"
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--reduced", "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert "MPS not available" in run.stdout
    data = json.loads(out.read_text())
    assert data["format"] == FORMAT and data["shares"] == [] and data["rates"] == {} and not data["mps"]
    held = data["residency"]
    # fp32 parameters, gradients and Adam's two moments
    assert held["state_bytes"] == 4 * 4 * held["params"] and held["params"] > 1e6
    assert held["freed_bytes"] == held["state_bytes"] and held["freed_measured"] is False
    assert held["other_process_allocated"] is True and held["offload_s"] >= 0 and held["onload_s"] >= 0
    sliced = data["time_sliced"]
    assert all(sliced["alone_iters_per_s"][k] > 0 for k in ("memory", "compute"))
    assert all(0 < sliced[k] < 2 for k in ("memory", "compute"))
    assert data["machine"]["device"] == "cpu" and data["machine"]["torch"].startswith("2.")
    table = InterferenceTable.load(out)
    assert table.shares == () and table.rates == {}
