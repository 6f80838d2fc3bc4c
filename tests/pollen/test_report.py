"""pollen report: fake results directories in, plots and report.md out."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from pollen.tools.report import write_report
from pollen.tools.runs import ReportError

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
ALL_PNGS = ("accuracy.png", "loss.png", "time.png", "bytes.png", "client-accuracy.png")


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def make_run(
    root: Path, name: str, algorithm: str, base: float, rounds: int = 3, server_eval: bool = True,
    times: list[float] | None = None, clock: str | None = None,
) -> Path:  # fmt: skip
    """A completed run whose accuracy rises by 0.05 a round from `base`; `times`: each round's
    `time`; `clock`: heterogeneity.clock, with the `tiers` device profile."""
    d = root / name
    d.mkdir(parents=True)
    devices = {"heterogeneity.clock": clock, "heterogeneity.profile": "tiers"} if clock else {}
    (d / "config.json").write_text(
        json.dumps(
            {
                "algorithm": algorithm,
                "dataset": "mnist-5k",
                "num-clients": 3,
                "num-rounds": rounds,
                "seed": 0,
                "lr": 0.05,
                **devices,
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
        if times is not None:
            row["time"] = times[r - 1]
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

    code = "import sys, pollen.tools.report; print('matplotlib.pyplot' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.stdout.strip() == "False"


# ---- a recorded run: `pollen simulate --algorithm fedavg --dataset digits --clients 3
# --rounds 2`, seeds 0 and 1 (tests/pollen/recorded/) ----------------------------------------
RECORDED = Path(__file__).parent / "recorded"
SEED0, SEED1 = RECORDED / "fedavg-digits-seed0", RECORDED / "fedavg-digits-seed1"
PLOT_NAMES = ("accuracy", "loss", "time", "bytes", "client-accuracy")


def _svg_texts(path: Path) -> list[str]:
    """Every text of an SVG (the report keeps text as text: no screenshot needed)."""
    import xml.etree.ElementTree as ET

    root = ET.parse(path).getroot()
    return ["".join(e.itertext()).strip() for e in root.iter() if e.tag.endswith("}text")]


def _copy(src: Path, dst: Path, **config: Any) -> Path:
    import shutil

    shutil.copytree(src, dst)
    if config:
        saved = json.loads((dst / "config.json").read_text())
        (dst / "config.json").write_text(json.dumps({**saved, **config}))
    return dst


def test_a_recorded_run_in_every_format(tmp_path: Path) -> None:
    out = write_report([SEED0], tmp_path / "r", formats=("png", "svg", "pdf"))
    for name in PLOT_NAMES:
        assert_png(out / f"{name}.png")
        assert (out / f"{name}.pdf").read_bytes()[:5] == b"%PDF-"
        assert _svg_texts(out / f"{name}.svg")
    accuracy = _svg_texts(out / "accuracy.svg")
    # server and clients told apart in the legend; the final evaluation named; the setting
    assert "clients: test-accuracy (mean over clients)" in accuracy
    assert "clients: test-accuracy (10th percentile)" in accuracy
    assert "server: test-accuracy" in accuracy
    assert "final evaluation (clients)" in accuracy
    assert "Test accuracy: digits, iid, 3 clients" in accuracy
    assert not any("fedavg (fedavg)" in t for t in accuracy)
    boxes = _svg_texts(out / "client-accuracy.svg")
    assert any("final evaluation" in t for t in boxes)
    assert "final, 3 clients" in boxes and not any("round 3" in t for t in boxes)
    md = (out / "report.md").read_text()
    assert "![accuracy](accuracy.png)" in md and "also written as SVG, PDF" in md
    assert "- partition: iid" in md and "- seed: 0" in md


def test_a_plot_without_data_in_a_format_no_longer_asked_for_is_removed(tmp_path: Path) -> None:
    out = write_report([SEED0], tmp_path / "r", formats=("svg",))
    assert (out / "accuracy.svg").exists() and not (out / "accuracy.png").exists()
    assert "![accuracy](accuracy.svg)" in (out / "report.md").read_text()
    write_report([make_failed(tmp_path)], out, formats=("png",))
    assert not (out / "accuracy.svg").exists() and not (out / "metrics.csv").exists()


def test_seeds_of_one_setting_are_drawn_as_mean_and_std(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import statistics

    out = write_report([SEED0, SEED1], tmp_path / "r", formats=("svg",))
    assert capsys.readouterr().err == ""  # the same settings but the seed: no warning
    texts = _svg_texts(out / "accuracy.svg")
    assert "clients: test-accuracy (mean over clients); mean ± std over 2 seeds" in texts
    assert "server: test-accuracy; mean ± std over 2 seeds" in texts
    assert "fedavg-digits (mean ± std over 2 seeds)" in _svg_texts(out / "time.svg")
    boxes = _svg_texts(out / "client-accuracy.svg")  # one box of both seeds' clients
    assert "fedavg-digits" in boxes and "final, 2 seeds x 3 clients" in boxes
    finals = [json.loads((d / "summary.json").read_text())["final"]["eval"]["test-accuracy"]
              for d in (SEED0, SEED1)]  # fmt: skip
    mean, std = statistics.fmean(finals), statistics.stdev(finals)
    md = (out / "report.md").read_text()
    assert "## Seeds" in md
    assert f"| fedavg-digits | 0, 1 | {mean:.4f} ± {std:.4f} (2) |" in md


def test_runs_differing_in_more_than_the_seed_get_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = _copy(SEED1, tmp_path / "lr-0.1", lr=0.1)
    out = write_report([SEED0, other], tmp_path / "r", formats=("svg",))
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "pollen: warning: the compared runs differ in settings other than the algorithm and "
        "the seed: lr: 0.05 (fedavg-digits-seed0), 0.1 (lr-0.1)"
    ]
    assert "**Warning:** the compared runs differ" in (out / "report.md").read_text()
    texts = _svg_texts(out / "accuracy.svg")  # two settings: a colour each, no band
    assert texts[-8:] == [
        "runs", "fedavg-digits-seed0", "lr-0.1 (fedavg)",
        "series", "clients: test-accuracy (mean over clients)",
        "clients: test-accuracy (10th percentile)", "server: test-accuracy",
        "final evaluation (clients)",
    ]  # fmt: skip
    assert not any("seeds" in t for t in texts)


def test_comparing_algorithms_with_their_own_settings_is_no_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prox = _copy(SEED0, tmp_path / "prox", algorithm="fedprox", **{"fedprox.mu": 0.1})
    write_report([SEED0, prox], tmp_path / "r", formats=("svg",))
    assert capsys.readouterr().err == ""


def test_a_directory_named_after_its_algorithm_is_labelled_once(tmp_path: Path) -> None:
    runs = [make_run(tmp_path, "fedavg", "fedavg", 0.6), make_run(tmp_path, "x", "fedprox", 0.7)]
    out = write_report(runs, tmp_path / "r", formats=("svg",))
    texts = " ".join(_svg_texts(out / "accuracy.svg")) + (out / "report.md").read_text()
    assert "fedavg (fedavg)" not in texts
    assert "x (fedprox)" in texts


def test_unknown_formats_are_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pollen.tools import cli

    code = cli.main(["report", str(SEED0), "--format", "png,gif", "--out", str(tmp_path / "r")])
    assert code == 2
    assert capsys.readouterr().err == (
        "pollen: error: --format 'png,gif': formats are a comma-separated list of png, svg, pdf\n"
    )
    assert not (tmp_path / "r").exists()


def test_a_private_runs_epsilon_is_a_column_of_the_rounds_table(tmp_path: Path) -> None:
    run = make_run(tmp_path, "dp", "fedavg", 0.5, rounds=2)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for row, eps in zip(rows, (1.25, 2.5), strict=True):
        row["train"]["epsilon"] = eps
    _write_jsonl(run / "metrics.jsonl", rows)
    text = (write_report([run]) / "report.md").read_text()
    header = next(line for line in text.splitlines() if line.startswith("| round"))
    assert "| epsilon |" in header
    assert "| 1.250 |" in text and "| 2.500 |" in text
    assert "epsilon: the largest over clients so far" in text
    plain = make_run(tmp_path, "plain", "fedavg", 0.5)
    assert "| epsilon |" not in (write_report([plain]) / "report.md").read_text()


def test_the_privacy_line_names_an_account_other_than_the_sample(tmp_path: Path) -> None:
    from pollen.core.runconfig import resolve
    from server.summary import privacy_summary

    def line(extra: dict[str, Any]) -> str:
        cfg = resolve({"num-clients": 10, "fraction-train": 0.5, "client-dp.clip": 1.0,
                       "client-dp.noise-multiplier": 2.0, **extra})  # fmt: skip
        run = make_run(tmp_path, f"dp-{len(list(tmp_path.iterdir()))}", "fedavg", 0.5)
        summary = json.loads((run / "summary.json").read_text())
        summary.update(privacy_summary(cfg, {"client-epsilon": 4.0}))
        (run / "summary.json").write_text(json.dumps(summary))
        text = (write_report([run]) / "report.md").read_text()
        return next(x for x in text.splitlines() if x.startswith("- client-level DP"))

    plain = line({})
    assert "sample-rate 0.5" in plain and "accounted rate" not in plain
    assert "sensitivity" not in plain
    over = line({"round.over-selection": 0.3})
    assert "accounted rate 0.65" in over and "sensitivity 2 x clip (over-selection" in over
    buffered = line({"async.buffer": 2})
    assert "sample-rate 1.0" in buffered and "sensitivity 2 x clip (FedBuff" in buffered


def test_a_run_under_attack_and_its_robust_rule_are_named(tmp_path: Path) -> None:
    from pollen.tools.report import _threat_lines
    from pollen.tools.runs import load_run

    run = make_run(tmp_path, "attacked", "fedavg", 0.5)
    summary = json.loads((run / "summary.json").read_text())
    plain = load_run(run).summary
    summary["robust"] = {"robust.rule": "median", "robust.f": 2}
    summary["attack"] = {"clients": [10, 11], "kind": "sign-flip", "simulated": True}
    (run / "summary.json").write_text(json.dumps(summary))
    assert _threat_lines(load_run(run).summary) == [
        "- robust aggregation: robust.f=2, robust.rule=median",
        "- **simulated attack**: clients [10, 11] act as sign-flip",
    ]
    assert _threat_lines(plain) == []
    assert _threat_lines(None) == []
    md = (write_report([run]) / "report.md").read_text()
    assert "- **simulated attack**: clients [10, 11] act as sign-flip" in md


def test_a_run_of_an_earlier_version_reports_what_it_has(tmp_path: Path) -> None:
    """Rows before codec-seconds, push-seconds and the server's evaluation, a summary before
    peak-rss-mb and the clients taking part: the report leaves those out, not in as zeros."""
    old = _copy(SEED0, tmp_path / "old")
    rows = [json.loads(x) for x in (old / "metrics.jsonl").read_text().splitlines()]
    for row in rows:
        del row["codec-seconds"], row["server-eval"]
        for phase in row["phases"]:
            del phase["push-seconds"]
    _write_jsonl(old / "metrics.jsonl", rows)
    summary = json.loads((old / "summary.json").read_text())
    del summary["peak-rss-mb"], summary["clients"], summary["final"]["server-eval"]
    (old / "summary.json").write_text(json.dumps(summary))
    out = write_report([old], tmp_path / "r", formats=("svg",))
    md = (out / "report.md").read_text()
    assert "- clients: 3 configured\n" in md and "- rounds: 2 of 2 recorded" in md
    header = next(line for line in md.splitlines() if line.startswith("| round"))
    assert "server" not in header and "| seconds | MB |" in header
    final = md.split("**Final evaluation**")[1]
    assert f"| test-accuracy | {summary['final']['eval']['test-accuracy']:.4f} | – |" in final
    assert "server: test-accuracy" not in _svg_texts(out / "accuracy.svg")
    metrics_csv = (out / "metrics.csv").read_text().splitlines()
    assert not any("server." in column for column in metrics_csv[0].split(","))


# ---- time to accuracy ----------------------------------------------------------------------
def _paced_runs(root: Path) -> list[Path]:
    """Two runs on the virtual clock. Their clients' test-accuracy, placed at the round of the
    model it describes (round r's at r-1, the final evaluation at the last round): fast 0.37,
    0.42, 0.47, 0.52 at rounds 0 to 3, ending at 10, 20, 30 s; slow 0.17, 0.22, 0.27, 0.32,
    ending at 50, 100, 150 s."""
    return [
        make_run(root, "fast", "fedavg", 0.32, times=[10.0, 20.0, 30.0], clock="virtual"),
        make_run(root, "slow", "fedprox", 0.12, times=[50.0, 100.0, 150.0], clock="virtual"),
    ]


def _section(md: str, title: str) -> list[str]:
    return md.split(f"## {title}\n")[1].split("\n## ")[0].strip().splitlines()


def test_time_to_accuracy_states_the_round_and_time_each_accuracy_is_first_reached(
    tmp_path: Path,
) -> None:
    out = write_report(_paced_runs(tmp_path), tmp_path / "r")
    md = (out / "report.md").read_text()
    # default accuracies: 50 %, 75 %, 90 % of the best final accuracy (fast's 0.52)
    assert _section(md, "Time to accuracy")[-4:] == [
        "| run | clock | clients test-accuracy ≥ 0.2600 | clients test-accuracy ≥ 0.3900 "
        "| clients test-accuracy ≥ 0.4680 |",
        "|---|---|---|---|---|",
        "| fast | virtual | round 0, 0.0 s | round 1, 10.0 s | round 2, 20.0 s |",
        "| slow | virtual | round 2, 100.0 s | not reached | not reached |",
    ]
    assert "50%, 75%, 90% of the best final clients test-accuracy" in md
    assert "- clock: virtual" in md
    rounds = next(line for line in md.splitlines() if line.startswith("| round"))
    assert rounds.endswith("| seconds | time | MB |")
    assert "| 2 | 0.4200 | 0.3500 | 0.4400 | 0.7500 | 12.3 | 20.0 | 2.0000 |" in md


def test_time_to_accuracy_of_runs_without_time_counts_their_rounds_seconds(
    tmp_path: Path,
) -> None:
    """Runs of earlier versions have no `time`: the running sum of the rounds' seconds (11.3,
    12.3, 13.3) stands in, on the wall clock, and the report says so."""
    from pollen.tools.plots import time_label
    from pollen.tools.report import time_to_accuracy
    from pollen.tools.runs import load_run

    run = load_run(make_run(tmp_path, "old", "fedavg", 0.5))
    assert not run.times_recorded and run.clock == "wall"
    assert run.round_times() == pytest.approx({0: 0.0, 1: 11.3, 2: 23.6, 3: 36.9})
    metric, targets, reached = time_to_accuracy([run], [0.62, 0.68, 0.9])
    assert metric == "clients test-accuracy" and targets == [0.62, 0.68, 0.9]
    # 0.55, 0.6, 0.65 at rounds 0 to 2, the final evaluation's 0.7 at round 3
    assert [(r.round, r.time) for r in reached] == [
        (2, pytest.approx(23.6)), (3, pytest.approx(36.9)), (None, None)]  # fmt: skip
    assert time_label([run]) == "seconds"
    md = (write_report([run.path], tmp_path / "r", accuracies=[0.62, 0.68]) / "report.md")
    text = md.read_text()
    assert "- clock: wall (no time recorded: the running sum of the rounds' seconds)" in text
    assert _section(text, "Time to accuracy")[-1] == (
        "| old | wall (no time recorded: the running sum of the rounds' seconds) "
        "| round 2, 23.6 s | round 3, 36.9 s |"
    )
    wall = load_run(make_run(tmp_path, "wall", "fedavg", 0.5, times=[1.0, 2.0, 3.0]))
    assert wall.times_recorded and wall.clock == "wall"  # no device profile: wall time
    assert wall.round_times() == {0: 0.0, 1: 1.0, 2: 2.0, 3: 3.0}


def test_the_accuracy_plot_has_a_panel_against_time_beside_the_rounds(tmp_path: Path) -> None:
    import xml.etree.ElementTree as ET

    out = write_report(_paced_runs(tmp_path), tmp_path / "r", formats=("svg", "png"))
    assert_png(out / "accuracy.png")
    root = ET.parse(out / "accuracy.svg").getroot()
    axes = [e.get("id") for e in root.iter() if (e.get("id") or "").startswith("axes_")]
    assert axes == ["axes_1", "axes_2"]
    texts = _svg_texts(out / "accuracy.svg")
    assert "round (the model after that round's aggregation; 0: the initial model)" in texts
    assert "virtual seconds" in texts and "Test accuracy against time" in texts
    assert texts.count("fast (fedavg)") == 1  # one legend for both panels
    ticks = texts[texts.index("Test accuracy: mnist-5k, 3 clients") + 1 : texts.index(
        "virtual seconds")]  # fmt: skip
    assert 120 <= max(int(t) for t in ticks) <= 160  # the slow run's last round ends at 150 s
    loss = ET.parse(write_report(_paced_runs(tmp_path / "b"), tmp_path / "r2",
                                 formats=("svg",)) / "loss.svg").getroot()  # fmt: skip
    assert [e.get("id") for e in loss.iter() if (e.get("id") or "").startswith("axes_")] == [
        "axes_1"]  # fmt: skip


def test_runs_on_both_clocks_are_labelled_so(tmp_path: Path) -> None:
    from pollen.tools.plots import time_label
    from pollen.tools.runs import load_run

    virtual, wall = (load_run(p) for p in _paced_runs(tmp_path))
    wall.config["heterogeneity.clock"] = "wall"
    assert time_label([virtual]) == "virtual seconds" and time_label([wall]) == "seconds"
    assert time_label([virtual, wall]).startswith("seconds (virtual for some runs, wall")


def test_the_accuracy_option_sets_the_accuracies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pollen.tools import cli

    runs = [str(p) for p in _paced_runs(tmp_path)]
    code = cli.main(["report", *runs, "--out", str(tmp_path / "r"), "--accuracy", "0.5", "0.2"])
    assert code == 0
    lines = _section((tmp_path / "r" / "report.md").read_text(), "Time to accuracy")
    assert "Accuracies: as asked (`--accuracy`)." in lines[0]
    assert lines[-2:] == [
        "| fast | virtual | round 0, 0.0 s | round 3, 30.0 s |",
        "| slow | virtual | round 1, 50.0 s | not reached |",
    ]
    with pytest.raises(SystemExit) as exited:
        cli.main(["report", *runs, "--accuracy", "80"])
    assert exited.value.code == 2
    assert "--accuracy: '80' is not an accuracy between 0 and 1" in capsys.readouterr().err
