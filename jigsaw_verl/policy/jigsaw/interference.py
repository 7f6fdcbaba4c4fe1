"""Co-location's two models: memory admission (the resource manager) and the interference table.

A lease gives a sub-stage a set of GPUs and, on each, a share of SMs and of memory. Two sub-stages may share a GPU
when their memory fits beside each other and their SM shares sum to at most 1; how fast each then runs comes from
an :class:`InterferenceTable`. In simulation the table is derived from the cost model
(:meth:`InterferenceTable.from_cost_model`); on a GPU it is profiled at warm-up and loaded from a file
(:meth:`InterferenceTable.load`). Its file format (JSON)::

    {"format": "jigsaw-interference/1",
     "gpu": "H100-80G",                       # informational
     "shares": [0.1, 0.2, ..., 0.9],           # SM share of the first sub-stage of a pair
     "classes": ["compute", "memory"],         # load classes; a sub-stage is classified by its bottleneck
     "rates": {"compute|memory": [[r_a, r_b], ...]}}   # per pair "a|b", one [speed of a, speed of b] per share,
                                                       # speeds as fractions of running alone

Both are pure: the policy asks them questions (which GPUs a newcomer may join is decided over the snapshot's
leases in :mod:`jigsaw_verl.policy.jigsaw.lookahead`); the executor applies the leases a policy chose.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from jigsaw_verl.model.cost_model import CostModel
from jigsaw_verl.model.footprint import stage_resident_bytes
from jigsaw_verl.model.spec import PipelineSpec

FORMAT = "jigsaw-interference/1"
CLASSES: tuple[str, ...] = ("compute", "memory")
SHARES: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)

# Representative per-GPU needs (fraction of SMs, fraction of HBM bandwidth) of each class running alone: a
# training micro-batch keeps SMs busy; a long-tail decode step streams weights and KV with a few SMs.
REPRESENTATIVE = {"compute": (0.95, 0.1), "memory": (0.25, 0.6)}


@dataclass(frozen=True)
class InterferenceTable:
    """Speeds of two co-located sub-stages, by class pair and SM share.

    Attributes:
        gpu: GPU name the table was made for.
        shares: SM shares of the first sub-stage of a pair, ascending.
        rates: ``"a|b"`` -> one ``(speed of a, speed of b)`` per share; speeds are fractions of running alone.
    """

    gpu: str
    shares: tuple[float, ...]
    rates: dict = field(default_factory=dict)

    @classmethod
    def from_cost_model(cls, cost: CostModel) -> InterferenceTable:
        """Derive the table from the cost model's co-location model at representative loads (simulation)."""
        rates = {}
        for a in CLASSES:
            for b in CLASSES:
                row = []
                for s in SHARES:
                    la = cost.stage_load_from_needs(*REPRESENTATIVE[a], sm_share=s)
                    lb = cost.stage_load_from_needs(*REPRESENTATIVE[b], sm_share=1.0 - s)
                    row.append(cost.colocated_rates(la, lb) or (0.0, 0.0))
                rates[f"{a}|{b}"] = tuple(row)
        return cls(cost.gpu.name, SHARES, rates)

    @classmethod
    def load(cls, path: str | Path) -> InterferenceTable:
        """Read a profiled table; raises ``ValueError`` naming the file on a malformed one."""
        data = json.loads(Path(path).read_text())
        if data.get("format") != FORMAT:
            raise ValueError(f"{path}: format: expected {FORMAT!r}, got {data.get('format')!r}")
        shares = tuple(float(s) for s in data["shares"])
        rates = {}
        for pair, row in data["rates"].items():
            if len(row) != len(shares) or any(len(r) != 2 or not all(0 <= x <= 1 for x in r) for r in row):
                raise ValueError(f"{path}: rates.{pair}: expected one [speed, speed] in [0, 1] per share")
            rates[pair] = tuple((float(a), float(b)) for a, b in row)
        return cls(str(data.get("gpu", "")), shares, rates)

    def save(self, path: str | Path) -> None:
        data = {
            "format": FORMAT,
            "gpu": self.gpu,
            "shares": list(self.shares),
            "classes": sorted({c for pair in self.rates for c in pair.split("|")}),
            "rates": {k: [list(r) for r in v] for k, v in self.rates.items()},
        }
        Path(path).write_text(json.dumps(data, indent=1))

    def best_share(self, a: str, b: str, weight_a: float = 1.0) -> tuple[float, float, float]:
        """The SM share of ``a`` that maximises ``weight_a * speed_a + speed_b``, with both speeds."""
        row = self.rates[f"{a}|{b}"]
        i = max(range(len(row)), key=lambda j: (weight_a * row[j][0] + row[j][1], -j))
        return self.shares[i], row[i][0], row[i][1]


@dataclass(frozen=True, kw_only=True)
class ResourceManager:
    """Memory admission: what a stage needs resident on each of its GPUs.

    Attributes:
        specs: the pipelines, by name.
        min_train: per pipeline, fewest GPUs that hold its training state.
    """

    specs: dict[str, PipelineSpec]
    min_train: dict[str, int]

    def stage_bytes(self, pipeline: str, stage: str, gpus: int) -> float:
        """Per-GPU bytes a stage needs resident (:func:`~jigsaw_verl.model.footprint.stage_resident_bytes`, the
        rule the live executor admits by)."""
        return stage_resident_bytes(self.specs[pipeline], stage, gpus)
