"""pollen report: fake results directories in, plots and report.md out."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from pollen.report import ReportError, write_report

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
ALL_PNGS = ("accuracy.png", "loss.png", "time.png", "bytes.png", "client-accuracy.png")


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def make_run(
    root: Path, name: str, algorithm: str, base: float, rounds: int = 3, server_eval: bool = True
) -> Path:
    """A completed run whose accuracy rises by 0.05 a round from `base`."""
    d = root / name
    d.mkdir(parents=True)
    (d / "config.json").write_text(
        json.dumps(
            {
                "algorithm": algorithm,
                "dataset": "mnist-5k",
                "num-clients": 3,
                "num-rounds": rounds,
                "seed": 0,
                "lr": 0.05,
            }
        )
    )
    metrics, clients = [], []
    for r in range(1, rounds + 1):
        acc = base + 0.05 * r
        row: dict[str, Any] = {
            "round": r,
            "train": {
                "test-accuracy": acc,
                "test-accuracy-p10": acc - 0.07,
                "test-accuracy-min": acc - 0.1,
                "test-loss": 1.0 / r,
                "train-loss": 1.5 / r,
                "clients": 3.0,
            },
            "phases": [
                {
                    "phase": "train",
                    "sent": 3,
                    "valid": 3,
                    "failed": {},
                    "seconds": 10.0 + r,
                    "bytes-sent": 1_500_000,
                    "bytes-received": 500_000,
                }
            ],
            "seconds": 10.3 + r,
            "bytes-sent": 1_500_000,
            "bytes-received": 500_000,
        }
        row["server-eval"] = (
            {"test-accuracy": acc + 0.02, "test-loss": 0.9 / r, "test-examples": 1000.0}
            if server_eval
            else {}
        )
        metrics.append(row)
        for cid in range(3):
            clients.append(
                {
                    "round": r,
                    "client-id": cid,
                    "phase": "train",
                    "metrics": {"num-examples": 1000, "test-accuracy": acc + 0.01 * cid},
                }
            )
    _write_jsonl(d / "metrics.jsonl", metrics)
    _write_jsonl(d / "clients.jsonl", clients)
    final_acc = base + 0.05 * (rounds + 1)
    (d / "summary.json").write_text(
        json.dumps(
            {
                "status": "completed",
                "algorithm": algorithm,
                "dataset": "mnist-5k",
                "rounds": rounds,
                "final": {
                    "eval": {"test-accuracy": final_acc, "test-accuracy-p10": final_acc - 0.07},
                    "server-eval": {"test-accuracy": final_acc + 0.02},
                },
                "seconds": 40.0 + base,
                "clients": [0, 1, 2],
            }
        )
    )
    return d


def make_failed(root: Path, name: str = "broken") -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "summary.json").write_text(
        json.dumps(
            {
                "status": "failed",
                "reason": "RuntimeError: no clients connected within 300 s",
                "algorithm": "fedem",
                "dataset": "cifar10",
                "last-completed-round": 0,
                "seconds": 301.5,
            }
        )
    )
    return d


def assert_png(path: Path) -> None:
    assert path.is_file(), path
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, path
    assert len(data) > 2000, path


@pytest.fixture()
def two_runs(tmp_path: Path) -> list[Path]:
    return [
        make_run(tmp_path, "run-avg", "fedavg", 0.60),
        make_run(tmp_path, "run-prox", "fedprox", 0.70),
    ]


def test_two_runs_report_and_plots(two_runs: list[Path]) -> None:
    out = write_report(two_runs)
    assert out == two_runs[0] / "report"
    md = (out / "report.md").read_text()
    assert "## run-avg" in md and "## run-prox" in md
    assert "fedavg" in md and "fedprox" in md
    # round 2 of run-avg: clients 0.70, p10 0.63, server 0.72; round 3 of run-prox: 0.85
    assert "| 2 | 0.7000 | 0.6300 | 0.7200 | 0.7500 | 12.3 | 2.0000 |" in md
    assert "0.8500" in md
    # comparison table with the final figures of both runs
    assert "## Comparison" in md
    assert "| run-avg | fedavg | completed | 0.8000 | 0.7300 | 40.6 |" in md
    assert "| run-prox | fedprox | completed | 0.9000 | 0.8300 | 40.7 |" in md
    for name in ALL_PNGS:
        assert_png(out / name)
        assert f"]({name})" in md


def test_single_run_has_no_comparison_and_skips_empty_columns(tmp_path: Path) -> None:
    run = make_run(tmp_path, "solo", "fedavg", 0.5, server_eval=False)
    out = write_report([run], tmp_path / "elsewhere")
    assert out == tmp_path / "elsewhere"
    md = (out / "report.md").read_text()
    assert "## Comparison" not in md
    assert "server test-accuracy" not in md.split("**Per round**")[1].split("\n\n")[1]
    assert "| 1 | 0.5500 | 0.4800 | 1.5000 | 11.3 | 2.0000 |" in md
    assert_png(out / "accuracy.png")


def test_failed_run_with_only_summary(tmp_path: Path) -> None:
    out = write_report([make_failed(tmp_path)])
    md = (out / "report.md").read_text()
    assert "failed" in md
    assert "RuntimeError: no clients connected within 300 s" in md
    assert "metrics.jsonl" in md and "clients.jsonl" in md  # named as missing
    assert "301.5" in md
    for name in ALL_PNGS:
        assert not (out / name).exists()


def test_failed_run_next_to_completed_one(two_runs: list[Path], tmp_path: Path) -> None:
    out = write_report([*two_runs, make_failed(tmp_path)], tmp_path / "r")
    md = (out / "report.md").read_text()
    assert "| broken | fedem | failed | – | – | 301.5 |" in md
    assert_png(out / "accuracy.png")


def test_missing_directory_raises(tmp_path: Path) -> None:
    with pytest.raises(ReportError, match="nope"):
        write_report([tmp_path / "nope"])


def test_directory_without_results_raises(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ReportError, match="empty"):
        write_report([tmp_path / "empty"])


def test_corrupt_metrics_line_raises(two_runs: list[Path]) -> None:
    path = two_runs[1] / "metrics.jsonl"
    lines = path.read_text().splitlines()
    lines[1] = lines[1][:40]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ReportError, match=r"metrics\.jsonl: line 2"):
        write_report(two_runs)


def test_same_directory_names_get_distinct_labels(tmp_path: Path) -> None:
    a = make_run(tmp_path / "a", "results", "fedavg", 0.6)
    b = make_run(tmp_path / "b", "results", "fedavg", 0.7)
    md = (write_report([a, b], tmp_path / "r") / "report.md").read_text()
    assert "## a/results" in md and "## b/results" in md


def test_importing_does_not_load_pyplot() -> None:
    import subprocess

    code = "import sys, pollen.report; print('matplotlib.pyplot' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.stdout.strip() == "False"
