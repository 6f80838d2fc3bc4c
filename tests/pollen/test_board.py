"""`--tensorboard DIR`: a recorded run's files followed into TensorBoard event files, read back."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from pollen.tools import board, cli
from pollen.tools.progress import Progress

RECORDED = Path(__file__).parent / "recorded" / "fedavg-digits-seed0"
"""`pollen simulate --algorithm fedavg --dataset digits --clients 3 --rounds 2`."""


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_recorded_run_reads_back_with_its_tags_and_steps(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    results = tmp_path / "run"
    shutil.copytree(RECORDED, results)  # a finished run: followed in one poll
    logs = tmp_path / "tb" / "run"
    sink = board.Board(logs, 2, "fedavg")
    progress = Progress(results, io.StringIO(), num_rounds=2, sinks=[sink])
    progress.close()

    acc = EventAccumulator(str(logs), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    rows = _jsonl(RECORDED / "metrics.jsonl")
    final = json.loads((RECORDED / "summary.json").read_text())["final"]["eval"]

    def scalars(tag: str) -> list[tuple[int, Any]]:
        return [(e.step, pytest.approx(e.value, abs=1e-6)) for e in acc.Scalars(tag)]

    # the step is the round whose model a figure describes: clients' test figures of round r
    # evaluate the model of round r-1; the final evaluation, the last round's
    assert scalars("clients/test-accuracy") == [
        (0, rows[0]["train"]["test-accuracy"]),
        (1, rows[1]["train"]["test-accuracy"]),
        (2, final["test-accuracy"]),
    ]
    assert scalars("clients/train-loss") == [(r["round"], r["train"]["train-loss"]) for r in rows]
    assert scalars("server/test-accuracy") == [
        (r["round"], r["server-eval"]["test-accuracy"]) for r in rows
    ]
    assert scalars("round/seconds") == [(r["round"], r["seconds"]) for r in rows]
    assert scalars("round/MB") == [
        (r["round"], (r["bytes-sent"] + r["bytes-received"]) / 1e6) for r in rows
    ]
    tags = acc.Tags()
    assert "server/test-examples" not in tags["scalars"]  # counts are not curves
    clients = _jsonl(RECORDED / "clients.jsonl")
    histogram = acc.Histograms("per-client/test-accuracy")
    assert [h.step for h in histogram] == [0, 1, 2]
    for h, rnd in zip(histogram, (1, 2, 3), strict=True):
        values = [c["metrics"]["test-accuracy"] for c in clients if c["round"] == rnd]
        assert h.histogram_value.num == len(values) == 3
        assert h.histogram_value.sum == pytest.approx(sum(values))
    assert [h.step for h in acc.Histograms("per-client/train-loss")] == [1, 2]


def test_without_the_package_the_option_stops_the_command_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name)
    )
    assert board.missing() is not None
    out = tmp_path / "run"
    code = cli.main(["simulate", "--dataset", "digits", "--clients", "2", "--rounds", "1",
                     "--out", str(out), "--tensorboard", str(tmp_path / "tb")])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 2
    assert captured.err == f"pollen: error: {board.missing()}\n"
    assert "pip install 'pollen[tensorboard]'" in captured.err
    assert captured.out == "" and not out.exists() and not (tmp_path / "tb").exists()
