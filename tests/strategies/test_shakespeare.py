"""Next-character prediction end to end, in-process: a small char-lstm learns a tiny synthetic
text in LEAF's Shakespeare format through FedAvg and FedEM, beating the majority character."""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from client.app import app as client_app
from server.engine import Engine
from server.results import ResultsWriter
from strategies.base import Strategy
from strategies.fedavg import FedAvg
from strategies.fedem import FedEM
from tests.fakes import FakeClock, FakeGrid, settings_of
from tests.leaf import word_text, write_leaf

# two "styles" of text, so that clients differ and a mixture has something to fit
STYLES = (("the", "cat", "sat", "on", "a", "mat"), ("we", "go", "to", "sea", "by", "ship"))
NUM_CLIENTS = 4
WINDOWS = 100  # LEAF samples per client: 80 train, 20 test


@pytest.fixture(scope="module")
def leaf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("leaf")
    rng = np.random.default_rng(0)
    texts = {
        f"PLAY_ROLE{i}": word_text(rng, STYLES[i % 2], 80 + WINDOWS) for i in range(NUM_CLIENTS)
    }
    write_leaf(root, texts)
    return root


def _majority_rate(leaf_dir: Path) -> float:
    """Share of the most common character among the clients' test targets."""
    counts: dict[str, int] = {}
    for path in (leaf_dir / "shakespeare" / "data" / "test").glob("*.json"):
        for entry in json.loads(path.read_text())["user_data"].values():
            for x, y in zip(entry["x"], entry["y"], strict=True):
                for c in x[1:] + y:
                    counts[c] = counts.get(c, 0) + 1
    assert set(counts) <= set(string.printable)
    return max(counts.values()) / sum(counts.values())


def _run(cfg: dict[str, Any], strategy: Strategy) -> dict[str, Any]:
    grid = FakeGrid(client_app, NUM_CLIENTS, cfg)
    clock = FakeClock()
    engine = Engine(
        grid, cfg, strategy, ResultsWriter(cfg["out-dir"]), clock=clock, sleep=clock.sleep
    )
    return engine.run()


def _settings(run_config: dict[str, Any], leaf_dir: Path, **extra: Any) -> dict[str, Any]:
    return settings_of({
        **run_config, "dataset": "shakespeare", "model": "char-lstm-small",
        "partitioner": "natural", "num-clients": NUM_CLIENTS, "val-fraction": 0.0,
        "data-dir": str(leaf_dir), "num-rounds": 8, "batch-size": 16, "lr": 0.6,
        "momentum": 0.9, **extra,
    })  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["fedavg", "fedem"])
def test_char_lstm_beats_the_majority_character(
    run_config: dict[str, Any], leaf_dir: Path, algorithm: str
) -> None:
    extra = {"algorithm": algorithm, "fedem.components": 2} if algorithm == "fedem" else {}
    cfg = _settings(run_config, leaf_dir, **extra)
    strategy = FedEM(cfg) if algorithm == "fedem" else FedAvg(cfg)
    summary = _run(cfg, strategy)
    assert summary["status"] == "completed"
    final = summary["final"]["eval"]
    majority = _majority_rate(leaf_dir)
    assert final["clients"] == NUM_CLIENTS
    assert final["test-accuracy"] > majority + 0.1, (final["test-accuracy"], majority)
    if algorithm == "fedavg":  # the server scores the global model on the clients' test texts
        server = summary["final"]["server-eval"]
        assert server["test-accuracy"] > majority + 0.1
        assert server["test-examples"] == NUM_CLIENTS * (WINDOWS - int(0.8 * WINDOWS))
