"""examples/quickstart-fedem run as a Flower user runs it: `flwr run` of the project on Flower's
simulation runtime (a SuperLink started with --simulation), then with Pollen's own model and data
against `pollen simulate` of the same settings (docs/flower-apps.md#the-same-results)."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.pollen.flwr_apps import flwr_run

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "quickstart-fedem"
CLIENTS = 3
ROUNDS = 2
CONFIG: dict[str, Any] = {
    "num-server-rounds": ROUNDS, "components": 2, "local-epochs": 1, "lr": 0.05, "momentum": 0.9,
    "fraction-train": 1.0, "seed": 4,
}  # fmt: skip


def _flwr_run(app: Path, work: Path, cache: Path) -> dict[int, dict[str, float]]:
    """The example's final evaluation (its ServerApp prints it), from `flwr run` of `app` on
    CLIENTS simulated SuperNodes; the run must finish as completed."""
    log = flwr_run(app, work, cache, CLIENTS, CONFIG)
    found = re.search(r"Final evaluation on every client: (\{.*\})", log)
    assert found, log[-3000:]
    final: dict[int, dict[str, float]] = ast.literal_eval(found.group(1))
    return final


def test_the_example_runs_with_flwr_run_on_the_simulation_runtime(
    tmp_path: Path, shared_cache: Path
) -> None:
    app = tmp_path / "app"
    shutil.copytree(EXAMPLE, app)
    final = _flwr_run(app, tmp_path / "flwr", shared_cache)
    metrics = final[ROUNDS]
    assert metrics["clients"] == CLIENTS
    assert metrics["test-accuracy"] > 0.3  # its own CNN on its own MNIST shares; chance 0.1


def test_with_pollens_model_and_data_it_gives_pollen_simulates_results(
    tmp_path: Path, shared_cache: Path
) -> None:
    """The example with model_fn and data_fn left out (the README's note) trains Pollen's MLP on
    mnist-5k's partitions: the final metrics equal `pollen simulate`'s, bit for bit."""
    app = tmp_path / "app"
    shutil.copytree(EXAMPLE, app)
    client = app / "fedem_example" / "client_app.py"
    text = client.read_text()
    assert 'register(app, "fedem", model_fn=Net, data_fn=load_data)' in text
    client.write_text(text.replace(", model_fn=Net, data_fn=load_data", ""))
    server = app / "fedem_example" / "server_app.py"
    text = server.read_text()
    assert "        model_fn=Net,\n" in text
    server.write_text(text.replace("        model_fn=Net,\n", ""))
    final = _flwr_run(app, tmp_path / "flwr", shared_cache)[ROUNDS]

    out = tmp_path / "pollen"
    sets = {"fedem.components": CONFIG["components"], "local-epochs": CONFIG["local-epochs"],
            "lr": CONFIG["lr"], "momentum": CONFIG["momentum"],
            "fraction-train": CONFIG["fraction-train"], "seed": CONFIG["seed"]}  # fmt: skip
    argv = [sys.executable, "-m", "pollen.tools.cli", "simulate", "--algorithm", "fedem",
            "--clients", str(CLIENTS), "--rounds", str(CONFIG["num-server-rounds"]),
            "--out", str(out)]  # fmt: skip
    for key, value in sets.items():
        argv += ["--set", f"{key}={value}"]
    env = dict(os.environ, POLLEN_CACHE_DIR=str(shared_cache), FLWR_TELEMETRY_ENABLED="0")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["final"]["eval"] == final
