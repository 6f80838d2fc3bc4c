"""Paper experiments as files: several methods × seeds, one command, then a table.

An experiment file (TOML) names the runtime, the seeds, the settings every run shares and each
method's own settings:

    [experiment]
    name = "fedem-synthetic"
    mode = "simulate"            # or "deploy"
    seeds = [0, 1, 2]
    metrics = ["test-accuracy", "test-accuracy-p10"]   # "server-eval.X": the server's own

    [common]                     # any run setting (see `pollen settings`)
    dataset = "fedem-synthetic"

    [methods.fedem]
    algorithm = "fedem"

    [paper]                      # optional: the paper's figures, shown beside ours
    fedem = {"test-accuracy" = 0.747}

`pollen experiment FILE --out DIR` runs every (method, seed) that has no completed results in
DIR yet (so an interrupted experiment continues), then writes DIR/results.md and results.json
with mean ± std over seeds of each metric of the final evaluation: the clients' (a metric's
name), or the server's evaluation of the global model (`server-eval.<name>`).
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomllib

from pollen.core.runconfig import foreign_settings, resolve
from pollen.core.rundir import Summary, completed, read_summary, resumable
from pollen.core.settings import SettingsError, toml_value


@dataclass(frozen=True)
class Experiment:
    name: str
    mode: str
    seeds: tuple[int, ...]
    metrics: tuple[str, ...]
    common: dict[str, Any]
    methods: dict[str, dict[str, Any]]
    paper: dict[str, dict[str, float]]
    description: str = ""

    @classmethod
    def load(cls, path: Path) -> Experiment:
        try:
            raw = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise SettingsError(f"experiment file {path}: {exc}") from None
        head = raw.get("experiment", {})
        methods = raw.get("methods", {})
        if not methods:
            raise SettingsError(f"experiment file {path} has no [methods.*] tables")
        exp = cls(
            name=str(head.get("name", path.stem)),
            mode=str(head.get("mode", "simulate")),
            seeds=tuple(int(s) for s in head.get("seeds", [0])),
            metrics=tuple(head.get("metrics", ["test-accuracy", "test-accuracy-p10"])),
            common=_flat(raw.get("common", {})),
            methods={name: _flat(cfg) for name, cfg in methods.items()},
            paper={k: dict(v) for k, v in raw.get("paper", {}).items()},
            description=str(head.get("description", "")),
        )
        if exp.mode not in ("simulate", "deploy"):
            raise SettingsError(f"experiment mode must be simulate or deploy, not {exp.mode!r}")
        for method, cfg in exp.methods.items():  # every run's settings checked up front
            try:
                resolve({**exp.common, **cfg, "seed": exp.seeds[0]})
            except SettingsError as exc:
                raise SettingsError(f"method {method!r}: {exc}") from None
        return exp


def _flat(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in table.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def run_dir(out: Path, method: str, seed: int) -> Path:
    return out / f"{method}-seed{seed}"


def run(exp: Experiment, out: Path, runtime: Sequence[str] = ()) -> dict[str, Any]:
    """Every (method, seed) not completed in `out`, each as a `pollen simulate` (or `deploy`)
    with `runtime`'s options (e.g. `--gpus-per-client 0.5`), then the table."""
    out.mkdir(parents=True, exist_ok=True)
    for seed in exp.seeds:  # seed-major: a partial experiment still compares methods
        for method, cfg in exp.methods.items():
            target = run_dir(out, method, seed)
            if completed(target):
                print(f"== {method} seed {seed}: already done", flush=True)
                continue
            # `pollen simulate` itself submits again when Ray's runtime does not start
            argv = [*_argv(exp, cfg, method, seed, target), *runtime]
            done = subprocess.run(argv, check=False)
            if done.returncode != 0:
                raise SettingsError(f"{method} seed {seed} failed (exit {done.returncode})")
    return tabulate(exp, out)


def _argv(
    exp: Experiment, cfg: Mapping[str, Any], method: str, seed: int, target: Path
) -> list[str]:
    argv = [sys.executable, "-m", "pollen.tools.cli", exp.mode, "--out", str(target)]
    if resumable(target):  # an interrupted run continues from its last checkpoint
        print(f"== {method} seed {seed}: resuming", flush=True)
        return [*argv, "--resume"]
    if target.exists():  # interrupted before its first checkpoint
        shutil.rmtree(target)
    for key, value in method_settings(exp, cfg, seed).items():
        text = value if isinstance(value, str) else toml_value(value)
        argv += ["--set", f"{key}={text}"]
    print(f"== {method} seed {seed}", flush=True)
    return argv


def method_settings(exp: Experiment, cfg: Mapping[str, Any], seed: int) -> dict[str, Any]:
    """A method's settings: the experiment's common block without the settings its algorithm
    does not read (a FedEM experiment's `fedem.*` for its FedAvg baseline), then its own."""
    common = dict(exp.common)
    algorithm = str(cfg.get("algorithm", common.get("algorithm", "fedavg")))
    for key in foreign_settings(algorithm, common):
        del common[key]
    return {**common, **cfg, "seed": seed}


SERVER_EVAL = "server-eval."
"""Prefix of a metric taken from the final server-side evaluation instead of the clients'."""


def final_value(summary: Summary, metric: str) -> float | None:
    """A metric of a run's final evaluation: the clients' (`final.eval`), or with the
    `server-eval.` prefix the server's (`final.server-eval`); None when the run has none."""
    final = summary.final
    if final is None:
        return None
    if metric.startswith(SERVER_EVAL):
        values = final.server_eval or {}
        metric = metric.removeprefix(SERVER_EVAL)
    else:
        values = final.eval
    return float(values[metric]) if metric in values else None


def tabulate(exp: Experiment, out: Path) -> dict[str, Any]:
    """Mean ± std over seeds of the final evaluation's metrics; writes results.md/.json."""
    table: dict[str, Any] = {"experiment": exp.name, "seeds": list(exp.seeds), "methods": {}}
    for method in exp.methods:
        per_metric: dict[str, list[float]] = {m: [] for m in exp.metrics}
        seconds: list[float] = []
        for seed in exp.seeds:
            target = run_dir(out, method, seed)
            if not completed(target):
                continue
            summary = read_summary(target)
            if summary is None:
                continue
            for metric in exp.metrics:
                value = final_value(summary, metric)
                if value is not None:
                    per_metric[metric].append(value)
            seconds.append(summary.seconds)
        table["methods"][method] = {
            metric: {
                "mean": statistics.fmean(v) if v else None,
                "std": statistics.stdev(v) if len(v) > 1 else 0.0 if v else None,
                "values": v,
            }
            for metric, v in per_metric.items()
        } | {"seconds-per-run": statistics.fmean(seconds) if seconds else None}
    (out / "results.json").write_text(json.dumps(table, indent=2) + "\n")
    (out / "results.md").write_text(markdown(exp, table))
    return table


def _shown(metric: str, value: float) -> str:
    """Fractions (accuracy, energy captured) as percentages; other figures as they are."""
    if "accuracy" in metric or "energy" in metric:
        return f"{100 * value:.1f}"
    return f"{value:.3f}"


def markdown(exp: Experiment, table: Mapping[str, Any]) -> str:
    head = ["method", *[f"{m} (ours)" for m in exp.metrics]]
    if exp.paper:
        head += [f"{m} (paper)" for m in exp.metrics]
    lines = [f"# {exp.name}", ""]
    if exp.description:
        lines += [exp.description, ""]
    lines += [
        f"Mean ± std over seeds {list(exp.seeds)} of the final evaluation (accuracies and "
        "energies in %).",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for method, stats in table["methods"].items():
        cells = [method]
        for metric in exp.metrics:
            s = stats.get(metric) or {}
            if s.get("mean") is None:
                cells.append("–")
            else:
                mean, std = _shown(metric, s["mean"]), _shown(metric, s["std"])
                cells.append(f"{mean} ± {std} (n={len(s['values'])})")
        if exp.paper:
            paper = exp.paper.get(method, {})
            cells += [_shown(m, paper[m]) if m in paper else "–" for m in exp.metrics]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
