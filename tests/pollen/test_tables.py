"""pollen report's flat files: metrics.csv and clients.csv of recorded runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pollen.tools.runs import load_run
from pollen.tools.tables import write_tables
from tests.pollen.test_report import SEED0, SEED1


def test_the_flat_files_hold_every_round_client_and_the_final_evaluation(tmp_path: Path) -> None:
    import csv

    out = tmp_path
    assert write_tables([load_run(SEED0)], out) == ["metrics.csv", "clients.csv"]
    rows = list(csv.DictReader((out / "metrics.csv").open()))
    recorded = [json.loads(x) for x in (SEED0 / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((SEED0 / "summary.json").read_text())
    assert [(r["round"], r["stage"]) for r in rows] == [("1", "round"), ("2", "round"),
                                                       ("2", "final")]  # fmt: skip
    for row, rec in zip(rows, recorded, strict=False):
        assert row["run"] == "fedavg-digits-seed0" and row["algorithm"] == "fedavg"
        assert row["seed"] == "0" and row["dataset"] == "digits"
        assert float(row["clients.test-accuracy"]) == rec["train"]["test-accuracy"]
        assert float(row["server.test-accuracy"]) == rec["server-eval"]["test-accuracy"]
        assert int(row["bytes-sent"]) == rec["bytes-sent"]
    final = rows[-1]
    assert float(final["clients.test-accuracy"]) == summary["final"]["eval"]["test-accuracy"]
    assert final["seconds"] == "" and final["clients.train-loss"] == ""
    clients = list(csv.DictReader((out / "clients.csv").open()))
    recorded_clients = (SEED0 / "clients.jsonl").read_text().splitlines()
    assert len(clients) == len(recorded_clients) == 9  # 3 clients x (2 rounds + final)
    finals = [c for c in clients if c["stage"] == "final"]
    assert len(finals) == 3 and {c["round"] for c in finals} == {"2"}  # written as round 3
    assert {c["phase"] for c in finals} == {"evaluate"}
    assert all(0.0 <= float(c["test-accuracy"]) <= 1.0 for c in clients)


def test_the_flat_files_read_into_pandas(tmp_path: Path) -> None:
    pd = pytest.importorskip("pandas")
    write_tables([load_run(SEED0), load_run(SEED1)], tmp_path)
    metrics = pd.read_csv(tmp_path / "metrics.csv")
    final = metrics[metrics["stage"] == "final"].set_index("seed")["clients.test-accuracy"]
    assert final.to_dict() == pytest.approx({0: 0.575, 1: 0.5556}, abs=1e-4)
    assert str(metrics["round"].dtype) == "int64"


def test_time_to_accuracy_has_a_flat_file_and_metrics_csv_the_rounds_time(tmp_path: Path) -> None:
    import csv

    from pollen.tools.report import write_report
    from tests.pollen.test_report import make_run

    paced = make_run(tmp_path, "paced", "fedavg", 0.32, times=[10.0, 20.0, 30.0], clock="virtual")
    old = make_run(tmp_path, "old", "fedavg", 0.12)  # no `time`: its rounds' seconds summed
    out = write_report([paced, old], tmp_path / "r", accuracies=[0.4, 0.3])
    rows = list(csv.DictReader((out / "time-to-accuracy.csv").open()))
    assert [(r["run"], r["accuracy"], r["reached"], r["round"], r["time"], r["clock"],
             r["time-recorded"]) for r in rows] == [
        ("paced", "0.3", "True", "0", "0.0", "virtual", "True"),
        ("paced", "0.4", "True", "1", "10.0", "virtual", "True"),
        ("old", "0.3", "True", "3", "36.9", "wall", "False"),
        ("old", "0.4", "False", "", "", "wall", "False"),
    ]  # fmt: skip
    assert {r["metric"] for r in rows} == {"clients test-accuracy"}
    metrics = list(csv.DictReader((out / "metrics.csv").open()))
    assert [r["time"] for r in metrics if r["run"] == "paced"] == ["10.0", "20.0", "30.0", ""]
    assert {r["time"] for r in metrics if r["run"] == "old"} == {""}
