from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pollen.core.rundir import Summary
from pollen.core.settings import SettingsError
from pollen.tools.experiment import Experiment, final_value, run_dir, tabulate

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "exp.toml"
    path.write_text(text)
    return path


def test_every_shipped_experiment_file_is_valid() -> None:
    files = sorted(EXPERIMENTS.glob("*.toml"))
    assert files
    for path in files:
        exp = Experiment.load(path)
        assert exp.methods and exp.seeds


def test_shakespeare_experiment_has_the_papers_setting() -> None:
    from federated_data.shakespeare import reference_class_weights
    from pollen.core.dataspec import class_weights, model_input
    from pollen.core.runconfig import resolve

    exp = Experiment.load(EXPERIMENTS / "fedem_shakespeare.toml")
    assert set(exp.methods) == {"fedem", "fedavg", "fedprox", "fedavg-plus", "clustered", "local"}
    for method, cfg in exp.methods.items():
        settings = resolve({**exp.common, **cfg})
        assert settings["dataset"] == "shakespeare" and settings["partitioner"] == "natural"
        assert (settings["model"], settings["num-clients"], settings["num-rounds"]) == (
            "char-lstm",
            778,
            80,
        )
        assert settings["batch-size"] == 128 and settings["algorithm"] == method
        assert model_input(settings) == ((80,), 100)
        assert class_weights(settings) == reference_class_weights()
    assert exp.methods["fedem"]["fedem.components"] == 3
    assert exp.methods["fedem"]["lr"] == pytest.approx(10**-0.5, rel=1e-4)
    assert exp.paper["fedem"]["test-accuracy"] == 0.467


def test_bad_settings_in_an_experiment_are_named(tmp_path: Path) -> None:
    path = _write(tmp_path, '[methods.a]\nalgorithm = "fedavg"\nlr = "fast"\n')
    with pytest.raises(SettingsError, match="method 'a': setting 'lr'"):
        Experiment.load(path)
    with pytest.raises(SettingsError, match="no \\[methods"):
        Experiment.load(_write(tmp_path, "[common]\nlr = 0.1\n"))


def test_table_gives_mean_and_std_over_seeds(tmp_path: Path) -> None:
    exp = Experiment.load(
        _write(
            tmp_path,
            """
[experiment]
name = "t"
seeds = [0, 1]
metrics = ["test-accuracy"]
[methods.a]
algorithm = "fedavg"
[methods.b]
algorithm = "local"
[paper]
a = {"test-accuracy" = 0.5}
""",
        )
    )
    out = tmp_path / "out"
    for seed, acc in ((0, 0.6), (1, 0.8)):
        d = run_dir(out, "a", seed)
        d.mkdir(parents=True)
        (d / "summary.json").write_text(
            json.dumps(
                {"status": "completed", "final": {"eval": {"test-accuracy": acc}}, "seconds": 2}
            )
        )
    failed = run_dir(out, "b", 0)
    failed.mkdir(parents=True)
    (failed / "summary.json").write_text(json.dumps({"status": "failed"}))
    table = tabulate(exp, out)
    a = table["methods"]["a"]["test-accuracy"]
    assert a["mean"] == pytest.approx(0.7) and a["std"] == pytest.approx(0.1414, abs=1e-4)
    assert table["methods"]["b"]["test-accuracy"]["mean"] is None
    md = (out / "results.md").read_text()
    assert "| a | 70.0 ± 14.1 (n=2) | 50.0 |" in md and "| b | – | – |" in md


def test_table_shows_ratios_unscaled_and_energies_in_percent(tmp_path: Path) -> None:
    exp = Experiment.load(
        _write(
            tmp_path,
            """
[experiment]
name = "t"
metrics = ["error-ratio", "test-energy"]
[methods.a]
algorithm = "adept-ae"
""",
        )
    )
    out = tmp_path / "out"
    d = run_dir(out, "a", 0)
    d.mkdir(parents=True)
    final = {"error-ratio": 2.5, "test-energy": 0.75}
    (d / "summary.json").write_text(json.dumps({"status": "completed", "final": {"eval": final}}))
    tabulate(exp, out)
    assert "| a | 2.500 ± 0.000 (n=1) | 75.0 ± 0.0 (n=1) |" in (out / "results.md").read_text()


def test_a_metric_can_be_the_servers_final_evaluation(tmp_path: Path) -> None:
    raw = {
        "status": "completed",
        "final": {"eval": {"test-accuracy": 0.5}, "server-eval": {"test-accuracy": 0.9}},
    }
    summary = Summary.from_json(raw)
    assert final_value(summary, "test-accuracy") == 0.5
    assert final_value(summary, "server-eval.test-accuracy") == 0.9
    assert final_value(summary, "server-eval.test-loss") is None
    empty = Summary.from_json({"status": "completed", "final": {}})
    assert final_value(empty, "server-eval.test-accuracy") is None
    text = (
        '[experiment]\nmetrics = ["server-eval.test-accuracy"]\n'
        '[methods.a]\nalgorithm = "fedlrt"\n'
    )
    exp = Experiment.load(_write(tmp_path, text))
    d = run_dir(tmp_path / "out", "a", 0)
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps(raw))
    tabulate(exp, tmp_path / "out")
    assert "| a | 90.0 ± 0.0 (n=1) |" in (tmp_path / "out" / "results.md").read_text()


def test_an_interrupted_run_resumes_and_an_unstarted_one_starts_afresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import subprocess

    from pollen.tools import experiment

    exp = Experiment.load(
        _write(
            tmp_path,
            '[experiment]\nseeds = [0]\n[methods.a]\nalgorithm = "fedavg"\n'
            '[methods.b]\nalgorithm = "local"\n',
        )
    )
    out = tmp_path / "out"
    interrupted = run_dir(out, "a", 0)
    (interrupted / "checkpoint").mkdir(parents=True)
    (interrupted / "checkpoint" / "state.json").write_text("{}")
    (interrupted / "config.json").write_text("{}")
    (interrupted / "metrics.jsonl").write_text("kept\n")
    unstarted = run_dir(out, "b", 0)
    unstarted.mkdir(parents=True)
    (unstarted / "metrics.jsonl").write_text("stale\n")
    calls: list[list[str]] = []

    def fake_run(argv: list[str], check: bool) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0)

    monkeypatch.setattr(experiment.subprocess, "run", fake_run)
    monkeypatch.setattr(experiment, "tabulate", lambda exp, out: {})
    experiment.run(exp, out, ["--gpus-per-client", "0.5"])
    resumed, fresh = calls
    assert "--resume" in resumed and "--set" not in resumed
    for argv in calls:  # the runtime's options reach fresh and resumed runs alike
        assert argv[-2:] == ["--gpus-per-client", "0.5"]
    assert (interrupted / "metrics.jsonl").read_text() == "kept\n"
    assert "--resume" not in fresh and "algorithm=local" in fresh
    assert not (unstarted / "metrics.jsonl").exists()


def test_methods_option_runs_a_subset_and_names_unknown_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pollen.tools.cli import main

    path = _write(
        tmp_path,
        '[experiment]\nname = "two"\nseeds = [0]\n[methods.a]\nalgorithm = "fedavg"\n'
        '[methods.b]\nalgorithm = "local"\n',
    )
    out = tmp_path / "out"
    assert main(["experiment", str(path), "--out", str(out), "--table-only"]) == 2
    assert "holds no runs" in capsys.readouterr().err
    out.mkdir()
    assert main(["experiment", str(path), "--out", str(out), "--table-only", "--methods", "b"]) == 0
    assert set(json.loads((out / "results.json").read_text())["methods"]) == {"b"}
    assert main(["experiment", str(path), "--out", str(out), "--methods", "b,zz"]) == 2
    assert "--methods: zz; two has a, b" in capsys.readouterr().err


def test_gpu_options_reach_every_simulation_and_are_refused_for_deployment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pollen.tools import experiment
    from pollen.tools.cli import main

    seen: list[tuple[str, ...]] = []

    def fake_run(exp: Experiment, out: Path, runtime: tuple[str, ...] = ()) -> dict[str, Any]:
        seen.append(tuple(runtime))
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.md").write_text("table\n")
        return {"methods": {"a": {}}}

    monkeypatch.setattr(experiment, "run", fake_run)
    path = _write(tmp_path, '[experiment]\nseeds = [0]\n[methods.a]\nalgorithm = "fedavg"\n')
    out = str(tmp_path / "out")
    argv = ["experiment", str(path), "--out", out, "--gpus-per-client", "0.25", "--parallel", "4"]
    assert main(argv) == 0
    assert seen == [("--gpus-per-client", "0.25", "--parallel", "4")]
    deploy = _write(tmp_path, '[experiment]\nmode = "deploy"\n[methods.a]\nalgorithm = "fedavg"\n')
    assert main(["experiment", str(deploy), "--out", out, "--parallel", "2"]) == 2
    assert "options of simulation" in capsys.readouterr().err and len(seen) == 1


def test_a_failed_run_stops_the_experiment_without_running_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Retrying a runtime that did not start is `pollen simulate`'s job (tests/pollen/
    test_simulate.py); the experiment runs each command once."""
    import subprocess

    from pollen.tools import experiment

    exp = Experiment.load(
        _write(tmp_path, '[experiment]\nseeds = [0]\n[methods.a]\nalgorithm = "fedavg"\n')
    )
    calls: list[list[str]] = []

    def fake_run(argv: list[str], check: bool) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 1)

    monkeypatch.setattr(experiment.subprocess, "run", fake_run)
    with pytest.raises(SettingsError, match="a seed 0 failed \\(exit 1\\)"):
        experiment.run(exp, tmp_path / "out")
    assert len(calls) == 1 and calls[0][3] == "simulate"
