"""The probe script's untrained rows: one initial model per data split, not per first run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from experiments.fedsc_probe_features import settings_of, untrained_key
from pollen.core.runconfig import resolve

FEDERATED = {
    "algorithm": "fedsc",
    "num-clients": 5,
    "partitioner": "one-class",
    "classes-per-client": 2,
    "fedsc.encoder": "cnn-gn",
}


def _run(tmp_path: Path, name: str, **overrides: object) -> dict[str, Any]:
    """The settings of a run directory, as the script reads them from its config.json."""
    run = tmp_path / name
    run.mkdir()
    (run / "config.json").write_text(json.dumps(resolve({**FEDERATED, **overrides})))
    return settings_of(run)


def test_methods_sharing_split_and_encoder_share_the_untrained_row(tmp_path: Path) -> None:
    fedsc = _run(tmp_path, "fedsc-seed0", seed=0)
    fedavg = _run(tmp_path, "fedavg-sc-seed1", algorithm="fedavg-sc", seed=1, **{"fedsc.mu": 2.0})
    assert untrained_key(fedsc) == untrained_key(fedavg)  # seed and training settings aside


def test_other_split_or_encoder_gets_its_own_untrained_row(tmp_path: Path) -> None:
    fedsc = untrained_key(_run(tmp_path, "fedsc-seed0", seed=0))
    central = untrained_key(
        _run(tmp_path, "central-seed0", seed=0, **{"num-clients": 1, "partitioner": "iid"})
    )
    batchnorm = untrained_key(_run(tmp_path, "bn-seed0", seed=0, **{"fedsc.encoder": "cnn"}))
    assert len({fedsc, central, batchnorm}) == 3
