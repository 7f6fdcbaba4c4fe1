"""The README's calibration holds: verl's rollout share within 10 points of the public figures."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))

from calibrate import TOLERANCE_POINTS, calibration_workloads, rollout_share  # noqa: E402


def test_rollout_shares_match_public_verl_runs():
    for name, (wd, target) in calibration_workloads(steps=2).items():
        share = rollout_share(wd)["rollout_share_pct"]
        assert abs(share - target) <= TOLERANCE_POINTS, (name, share, target)
