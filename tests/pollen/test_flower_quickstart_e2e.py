"""Flower's PyTorch quickstart (examples/quickstart-pytorch: its CNN, its DataLoaders of
{"img", "label"} dicts, its `evaluate_fn`) switched to Pollen's algorithms by the patches in its
variants/ directory, as docs/flower-apps.md shows them: each changes at most 15 lines and runs
by `flwr run` on Flower's simulation runtime to a completed run with its metrics."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.pollen.flwr_apps import flwr_run

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "quickstart-pytorch"
VARIANTS = sorted(p.stem for p in (EXAMPLE / "variants").glob("*.patch"))
ROUNDS = 2
METRICS = {  # what the clients report each round, per algorithm
    "fedem": "test-accuracy", "fedlrt": "test-accuracy", "scaffold": "test-accuracy",
    "fedsc": "knn-accuracy", "adept-ae": "test-energy",
}  # fmt: skip
OWN_MODEL = {"fedem", "fedlrt", "scaffold"}  # the quickstart's Net and its evaluate_fn


def changed_lines(patch: str) -> int:
    """Lines a patch changes: in each hunk, the larger of the lines it adds and removes (a
    line replaced counts once)."""
    total = 0
    for hunk in re.split(r"^@@.*@@.*$", patch, flags=re.M)[1:]:
        lines = hunk.splitlines()
        added = sum(1 for line in lines if line.startswith("+"))
        removed = sum(1 for line in lines if line.startswith("-"))
        total += max(added, removed)
    return total


def test_the_variants_are_the_algorithms_the_guide_names() -> None:
    assert sorted(METRICS) == VARIANTS


@pytest.mark.parametrize("name", VARIANTS)
def test_the_quickstart_switched_to_a_pollen_algorithm_runs_with_flwr_run(
    name: str, tmp_path: Path, shared_cache: Path
) -> None:
    patch = (EXAMPLE / "variants" / f"{name}.patch").read_text()
    assert changed_lines(patch) <= 15, name
    app = tmp_path / "app"
    shutil.copytree(EXAMPLE, app, ignore=shutil.ignore_patterns("variants", "__pycache__"))
    done = subprocess.run(["git", "apply", "-p1", "-"], input=patch, cwd=app, text=True,
                          capture_output=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    log = flwr_run(
        app, tmp_path / "flwr", shared_cache, 2, {"num-server-rounds": ROUNDS, "lr": 0.05}
    )
    # each round logged as Flower's strategies log it, with the clients' metrics
    assert f"[ROUND {ROUNDS}/{ROUNDS}]" in log, log[-3000:]
    rounds = re.findall(r"Aggregated MetricRecord: (\{.*\})", log)
    assert len(rounds) == ROUNDS and all(f"'{METRICS[name]}'" in r for r in rounds), log[-3000:]
    assert "Strategy execution finished" in log and "Saving final model" in log
    if name in OWN_MODEL:  # the quickstart's evaluate_fn loaded the global model into its Net
        evaluations = re.findall(r"MetricRecord: (\{'(?:comp0\.)?accuracy'.*\})", log)
        assert len(evaluations) == ROUNDS, log[-3000:]
        final = float(re.findall(r"accuracy': ([0-9.e-]+)", evaluations[-1])[0])
        assert final > 0.2, evaluations  # the central test set; chance is 0.1
