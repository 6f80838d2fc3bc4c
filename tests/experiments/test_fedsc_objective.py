"""The objective script: views paired by image, every model scored on the same views."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from experiments import fedsc_objective
from experiments.fedsc_probe_features import initial_weights
from tests.fakes import settings_of


def test_terms_pair_the_views_of_one_image() -> None:
    """Views [a, a', b, b'] pair (a, a') and (b, b'): with a' = a and b' = b every positive
    pair is an image with itself, so the contraction is -Tr(R)."""
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(5, 3, generator=gen), torch.randn(5, 3, generator=gen)
    out = fedsc_objective.terms(torch.nn.Identity(), [[a, a, b, b]], [1.0], mu=100.0)
    r = torch.cat([a, b]).double()
    assert out["contraction"] == pytest.approx(-float((r * r).sum(1).mean()), rel=1e-12)
    crossed = fedsc_objective.terms(torch.nn.Identity(), [[a, b, a, b]], [1.0], mu=100.0)
    assert crossed["contraction"] != pytest.approx(out["contraction"], rel=1e-3)


def _rows(markdown: str) -> dict[str, list[str]]:
    rows = {}
    for line in markdown.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return rows


def test_models_are_scored_on_the_same_views(
    run_config: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run whose final model is its initial one scores exactly the untrained row; a run with
    other weights does not."""
    cfg = settings_of({
        **run_config, "algorithm": "fedsc", "num-clients": 4, "partitioner": "one-class",
        "classes-per-client": 2, "fedsc.dim": 8, "seed": 0,
    })  # fmt: skip
    out = tmp_path / "results"
    start = initial_weights(cfg)
    moved = {k: v + 0.05 if v.dtype.kind == "f" else v for k, v in start.items()}
    for name, weights in (("fedsc-seed0", start), ("fedavg-sc-seed0", moved)):
        (out / name).mkdir(parents=True)
        (out / name / "config.json").write_text(json.dumps(cfg))
        np.savez(out / name / "final_model.npz", **weights)
    monkeypatch.setattr(sys, "argv", ["fedsc_objective", str(out), "--views", "2"])
    fedsc_objective.main()
    rows = _rows((out / "objective.md").read_text())
    assert set(rows) == {"fedsc", "fedavg-sc", "untrained"}
    assert rows["fedsc"] == rows["untrained"]
    assert rows["fedavg-sc"] != rows["untrained"]
