"""A Markdown summary of one or more results directories (`pollen report`): report.md, beside
the plots (pollen.tools.plots) and flat CSV files (pollen.tools.tables) it names; the runs are
read and grouped by pollen.tools.runs.

The files are read defensively: a run that failed early, or is still running, may lack any of
them, and the report says so instead of refusing. Runs whose settings differ only in the seed
are drawn together as their mean ± standard deviation; compared runs that differ in a setting
other than the algorithm (and its own settings) and the seed get a warning. The time each run
first reached given accuracies is tabulated (`time_to_accuracy`). matplotlib is imported only
when plotting, so importing this module stays cheap for the CLI.

What each file holds and how the figures place each value: docs/monitoring.md#reports.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from pollen.core.rundir import RoundRow, Summary
from pollen.tools.plots import (
    ACCURACY,
    BYTES,
    CLIENT_ACCURACY,
    ENERGY,
    EPSILON,
    ERROR_RATIO,
    FORMATS,
    LOSS,
    PLOTS,
    SIGMA,
    TIME,
    metric_series,
    write_plots,
)
from pollen.tools.runs import (
    TARGET_FRACTIONS,
    Group,
    Reached,
    ReportError,
    Run,
    as_int,
    as_number,
    default_targets,
    first_reached,
    group_runs,
    load_run,
    mean_std,
    partition_text,
    row_mb,
    setting_text,
    settings_warning,
    unique_names,
)
from pollen.tools.tables import CLIENTS_CSV, METRICS_CSV, TIME_TO_ACCURACY_CSV, write_tables

REPORT_MD = "report.md"
MISSING = "–"


def _fmt(value: Any, decimals: int = 4) -> str:
    if value is None:
        return MISSING
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.{decimals}f}" if math.isfinite(value) else str(value)
    return _cell(str(value))


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines


ROUND_COLUMNS: tuple[tuple[str, Callable[[RoundRow], Any], int], ...] = (
    ("clients test-accuracy", lambda r: as_number(r.train.get("test-accuracy")), 4),
    ("clients test-accuracy-p10", lambda r: as_number(r.train.get("test-accuracy-p10")), 4),
    ("server test-accuracy", lambda r: as_number((r.server_eval or {}).get("test-accuracy")), 4),
    ("train-loss", lambda r: as_number(r.train.get("train-loss")), 4),
    ("epsilon", lambda r: as_number(r.train.get("epsilon")), 3),
    ("client-epsilon", lambda r: as_number(r.train.get("client-epsilon")), 3),
    ("seconds", lambda r: r.seconds, 1),
    ("time", lambda r: r.time, 1),
    ("MB", row_mb, 4),
)


def _rounds_table(run: Run) -> list[str]:
    columns = [c for c in ROUND_COLUMNS if any(c[1](row) is not None for row in run.rows)]
    header = ["round", *(name for name, _, _ in columns)]
    body = [
        [_fmt(row.round), *(_fmt(get(row), dec) for _, get, dec in columns)]
        for row in run.rows
    ]
    lines = _table(header, body)
    if any(name.startswith("clients test-") for name, _, _ in columns):
        lines += [
            "",
            "Clients' test figures of round r evaluate the model they received at "
            "the start of that round (after round r-1's aggregation).",
        ]
    if any(name == "epsilon" for name, _, _ in columns):
        lines += [
            "",
            "epsilon: the largest over clients so far, at the run's delta (`dp.delta`; FedSC: "
            "`fedsc.delta`); -1: no guarantee (docs/privacy.md).",
        ]
    if any(name == "client-epsilon" for name, _, _ in columns):
        lines += [
            "",
            "client-epsilon: client-level DP so far, at `client-dp.delta`: what the released "
            "models say of everything one client contributed (docs/privacy.md).",
        ]
    return lines


def _final_table(run: Run) -> list[str]:
    clients, server = run.final_eval, run.final_server_eval
    keys = sorted(set(clients) | set(server))
    if not keys:
        return []
    body = [[_cell(k), _fmt(clients.get(k)), _fmt(server.get(k))] for k in keys]
    return ["**Final evaluation**", "", *_table(["metric", "clients", "server"], body)]


def _clients_text(run: Run) -> str:
    configured = as_int(run.config.get("num-clients"))
    connected = run.summary.clients if run.summary else None
    parts = []
    if configured is not None:
        parts.append(f"{configured} configured")
    if connected is not None:
        parts.append(f"{len(connected)} took part")
    return ", ".join(parts) or MISSING


def _rounds_text(run: Run) -> str:
    planned = run.planned_rounds
    done = run.last_round
    if done is None and run.summary is not None:
        done = run.summary.last_completed_round
    if done is None and planned is None:
        return MISSING
    if planned is None:
        return f"{done} recorded"
    return f"{done if done is not None else 0} of {planned} recorded"


def _threat_lines(summary: Summary | None) -> list[str]:
    """The robust rule and the simulated attack a run's summary names (docs/robustness.md)."""
    if summary is None:
        return []
    lines = []
    robust = summary.robust
    if robust is not None:
        shown = ", ".join(f"{k}={_cell(str(v))}" for k, v in sorted(robust.items()))
        lines.append(f"- robust aggregation: {shown}")
    attack = summary.attack
    if attack is not None:
        lines.append(
            f"- **simulated attack**: clients {_cell(str(attack.get('clients')))} act as "
            f"{_cell(str(attack.get('kind')))}"
        )
    secure = summary.secure_aggregation
    if secure:
        lines.append(
            f"- **secure aggregation**: {_cell(str(secure.get('protocol')))}; the server saw "
            f"{_cell(str(secure.get('server-sees')))}"
        )
    return lines + _privacy_lines(summary)


def _privacy_lines(summary: Summary) -> list[str]:
    """Each differential-privacy guarantee a run's summary states, with what it protects
    (docs/privacy.md): client-level DP, and DP-SGD's example-level DP."""
    privacy = summary.privacy
    if privacy is None:
        return []
    lines = []
    labels = {"client-level": "client-level DP", "example-level": "example-level DP"}
    for key in [*labels, *sorted(set(privacy) - set(labels))]:
        label = labels.get(key, f"{key} DP")
        entry = privacy.get(key)
        if not isinstance(entry, Mapping):
            continue
        eps = as_number(entry.get("epsilon"))
        spent = "no guarantee" if eps is not None and eps < 0 else f"epsilon {_fmt(eps, 3)}"
        how = [f"{k} {_cell(str(entry[k]))}" for k in ("mechanism", "noise-multiplier", "clip",
               "noise-at", "sample-rate", "epsilon-vs-server") if k in entry]  # fmt: skip
        rate, sensitivity = entry.get("accounted-rate"), entry.get("sensitivity")
        if rate is not None and rate != entry.get("sample-rate"):  # over-selection, FedBuff
            how.append(f"accounted rate {_cell(str(rate))}")
        if isinstance(sensitivity, str) and not sensitivity.startswith("1 x"):
            how.append(f"sensitivity {_cell(sensitivity)}")
        if entry.get("adaptive-clipping"):
            how.append("adaptive clipping")
        lines.append(
            f"- {label}: {spent} at delta {_cell(str(entry.get('delta')))} "
            f"({', '.join(how)}); protects {_cell(str(entry.get('protects')))}"
        )
    return lines


def _run_section(run: Run) -> list[str]:
    lines = [f"## {_cell(run.name)}", "", f"- directory: `{run.path}`", f"- status: {run.status}"]
    reason = run.summary.reason if run.summary else None
    if reason:
        lines.append(f"- reason: {_cell(str(reason))}")
    seconds = run.total_seconds()
    partition = partition_text(run.config)
    lines += [
        f"- algorithm: {_cell(run.algorithm)}",
        f"- dataset: {_cell(run.dataset)}",
        f"- partition: {_cell(partition) if partition else MISSING}",
        f"- clients: {_clients_text(run)}",
        f"- rounds: {_rounds_text(run)}",
        f"- seed: {_fmt(run.seed)}",
        f"- total seconds: {_fmt(seconds, 1) if seconds is not None else MISSING}",
        f"- clock: {_cell(run.clock_text) or MISSING}",
    ]
    lines += _threat_lines(run.summary)
    if run.missing:
        lines.append(f"- missing files: {', '.join(run.missing)}")
    lines.append("")
    if run.rows:
        lines += ["**Per round**", "", *_rounds_table(run), ""]
    else:
        lines += ["No per-round metrics were recorded.", ""]
    final = _final_table(run)
    lines += [*final, ""] if final else ["No final evaluation was recorded.", ""]
    return lines


def _comparison(runs: Sequence[Run]) -> list[str]:
    body = []
    for run in runs:
        final = run.final_eval
        seconds = run.total_seconds()
        body.append(
            [
                _cell(run.name),
                _cell(run.algorithm),
                _cell(run.status.split(" ")[0]),
                _fmt(as_number(final.get("test-accuracy"))),
                _fmt(as_number(final.get("test-accuracy-p10"))),
                _fmt(seconds, 1) if seconds is not None else MISSING,
            ]
        )
    header = ["run", "algorithm", "status", "final mean accuracy", "final p10 accuracy", "seconds"]
    return ["## Comparison", "", *_table(header, body), ""]


ACCURACY_SERIES = ("clients test-accuracy", "server test-accuracy")
"""The series time to accuracy reads, the first any run has: the accuracy plot's."""


def time_to_accuracy(
    runs: Sequence[Run], accuracies: Sequence[float] | None = None
) -> tuple[str, list[float], list[Reached]]:
    """When each run's accuracy first reached each of `accuracies` (default: TARGET_FRACTIONS
    of the best final accuracy among the runs), placed as the accuracy plot places it: (the
    series, the accuracies, a Reached per run with the series and accuracy)."""
    series = {run.name: metric_series(run, "accuracy") for run in runs}
    metric = next((m for m in ACCURACY_SERIES if any(m in s for s in series.values())), "")
    if not metric:
        return "", [], []
    tracks = {run.name: points for run in runs if (points := series[run.name].get(metric))}
    targets = sorted(set(accuracies)) if accuracies else default_targets(
        [points[-1][1] for points in tracks.values()]
    )  # fmt: skip
    reached = [
        first_reached(run, metric, tracks[run.name], target)
        for run in runs if run.name in tracks for target in targets
    ]  # fmt: skip
    return metric, targets, reached


def _time_to_accuracy_section(
    metric: str, targets: Sequence[float], reached: Sequence[Reached], given: bool
) -> list[str]:
    if not reached:
        return []
    how = "as asked (`--accuracy`)" if given else (
        f"{', '.join(f'{f:.0%}' for f in TARGET_FRACTIONS)} of the best final {metric} among "
        "the runs (`--accuracy A [A ...]` sets them)"
    )  # fmt: skip
    body: dict[str, list[str]] = {}
    for r in reached:
        cells = body.setdefault(r.run.name, [_cell(r.run.name), _cell(r.run.clock_text)])
        if r.round is None:
            cells.append("not reached")
        else:
            cells.append(f"round {r.round}, {_fmt(r.time, 1)} s")
    header = ["run", "clock", *(f"{metric} ≥ {t:.4f}" for t in targets)]
    return [
        "## Time to accuracy",
        "",
        f"The first round whose model's {metric} reaches each accuracy (placed as in the "
        "accuracy plot: 0 is the initial model), and the time that round ended, in seconds "
        f"since the run started on the run's clock. Accuracies: {how}.",
        "",
        *_table(header, list(body.values())),
        "",
    ]


def _seeds_table(groups: Sequence[Group]) -> list[str]:
    banded = [g for g in groups if g.banded]
    if not banded:
        return []
    keys = ("test-accuracy", "test-accuracy-p10")
    body = []
    for group in banded:
        cells = [_cell(group.label), ", ".join(str(s) for s in group.seeds) or MISSING]
        for key in keys:
            values = [v for r in group.runs if (v := as_number(r.final_eval.get(key))) is not None]
            if values:
                mean, std = mean_std(values)
                cells.append(f"{mean:.4f} ± {std:.4f} ({len(values)})")
            else:
                cells.append(MISSING)
        body.append(cells)
    header = ["runs", "seeds", "final mean accuracy", "final p10 accuracy"]
    return [
        "## Seeds",
        "",
        "Runs with the same settings but the seed: mean ± sample standard deviation over "
        "seeds (number of runs with the figure).",
        "",
        *_table(header, body),
        "",
    ]


PLOT_CAPTIONS = {
    ACCURACY: "Test accuracy per round: clients (mean over clients, and the 10th percentile) "
    "and the server's evaluation; x is the round whose aggregated model is evaluated; the star "
    "is the clients' final evaluation. Beside it, the same against the time each round ended "
    "(seconds since the run started, on the runs' clock).",
    LOSS: "Loss per round (placed like accuracy).",
    ENERGY: "Energy captured by the reconstructions per round (placed like accuracy).",
    ERROR_RATIO: "Reconstruction error over the true model's, per round.",
    SIGMA: "Mean of the learned sigma per round.",
    EPSILON: "Privacy spent (epsilon) per round.",
    TIME: "Seconds per round.",
    BYTES: "Traffic per round, bytes sent plus received, in MB.",
    CLIENT_ACCURACY: "Distribution of per-client test-accuracy in the final evaluation (or the "
    "last round reported).",
}


def render_markdown(
    runs: Sequence[Run], plots: Sequence[str], formats: Sequence[str] = ("png",),
    warning: str | None = None, files: Sequence[str] = (),
    accuracies: Sequence[float] | None = None,
) -> str:  # fmt: skip
    groups = group_runs(runs)
    lines = ["# Pollen report", ""]
    lines += [f"Runs: {', '.join(_cell(run.label) for run in runs)}.", ""]
    setting = setting_text(runs)
    if setting:
        lines += [f"Setting: {_cell(setting)}.", ""]
    if warning:
        lines += [f"**Warning:** {_cell(warning)}.", ""]
    if files:
        lines += [f"Flat files for pandas: {', '.join(f'`{f}`' for f in files)}.", ""]
    for run in runs:
        lines += _run_section(run)
    if len(runs) > 1:
        lines += _comparison(runs)
    lines += _seeds_table(groups)
    lines += _time_to_accuracy_section(*time_to_accuracy(runs, accuracies), bool(accuracies))
    shown = "png" if "png" in formats else "svg" if "svg" in formats else None
    if plots:
        lines += ["## Plots", ""]
        others = [f for f in formats if f != shown]
        if others:
            lines += [f"Each plot is also written as {', '.join(others).upper()}.", ""]
        for name in plots:
            lines += [PLOT_CAPTIONS[name], ""]
            lines += [f"![{name}]({name}.{shown})", ""] if shown else [f"`{name}.pdf`", ""]
    else:
        lines += ["No plots: no run recorded per-round or per-client metrics.", ""]
    return "\n".join(lines)


def parse_formats(text: str) -> tuple[str, ...]:
    """`png,svg,pdf` -> ("png", "svg", "pdf"); ReportError naming an unknown one."""
    formats = tuple(dict.fromkeys(f.strip().lower().lstrip(".") for f in text.split(",")))
    unknown = [f for f in formats if f not in FORMATS]
    if not formats or unknown or "" in formats:
        raise ReportError(
            f"--format {text!r}: formats are a comma-separated list of {', '.join(FORMATS)}"
        )
    return formats


def write_report(
    run_dirs: list[Path], out: Path | None = None, formats: Sequence[str] = ("png",),
    accuracies: Sequence[float] | None = None,
) -> Path:  # fmt: skip
    """Write plots, CSV files and report.md for the given results directories; returns the
    report directory (default: the first directory's report/). `accuracies`: those whose
    time to accuracy is stated (default: `time_to_accuracy`'s). A warning line goes to stderr
    when the runs differ in settings other than the algorithm and the seed."""
    if not run_dirs:
        raise ReportError("no results directories given")
    paths = [Path(p) for p in run_dirs]
    runs = [load_run(p, name) for p, name in zip(paths, unique_names(paths), strict=True)]
    out = Path(out) if out is not None else paths[0] / "report"
    warning = settings_warning(runs)
    if warning:
        print(f"pollen: warning: {warning}", file=sys.stderr)
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name in PLOTS:  # a plot that no longer has data must not linger from an earlier one
            for fmt in FORMATS:
                (out / f"{name}.{fmt}").unlink(missing_ok=True)
        for stale in (METRICS_CSV, CLIENTS_CSV, TIME_TO_ACCURACY_CSV):
            (out / stale).unlink(missing_ok=True)
        plots = write_plots(runs, out, formats)
        files = write_tables(runs, out, time_to_accuracy(runs, accuracies)[2])
        (out / REPORT_MD).write_text(
            render_markdown(runs, plots, formats, warning, files, accuracies)
        )
    except OSError as exc:
        raise ReportError(f"cannot write the report to {out}: {exc.strerror or exc}") from None
    return out
