"""Plots and a Markdown summary of one or more results directories (`pollen report`).

The files are read defensively: a run that failed early, or is still running, may lack any of
them, and the report says so instead of refusing. matplotlib is imported only when plotting,
so importing this module stays cheap for the CLI.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CONFIG = "config.json"
METRICS = "metrics.jsonl"
CLIENTS = "clients.jsonl"
SUMMARY = "summary.json"
RESULT_FILES = (CONFIG, METRICS, CLIENTS, SUMMARY)

REPORT_MD = "report.md"
ACCURACY_PNG = "accuracy.png"
LOSS_PNG = "loss.png"
TIME_PNG = "time.png"
BYTES_PNG = "bytes.png"
CLIENT_ACCURACY_PNG = "client-accuracy.png"
# Unsupervised runs (ADEPT): energy captured, error over the true model's, learned sigma
ENERGY_PNG = "energy.png"
ERROR_RATIO_PNG = "error-ratio.png"
SIGMA_PNG = "sigma.png"
PLOTS = (
    ACCURACY_PNG,
    LOSS_PNG,
    ENERGY_PNG,
    ERROR_RATIO_PNG,
    SIGMA_PNG,
    TIME_PNG,
    BYTES_PNG,
    CLIENT_ACCURACY_PNG,
)

# Sections of a metrics.jsonl row and how the report names them.
SECTIONS = (("train", "clients"), ("server-eval", "server"))
MISSING = "–"


class ReportError(ValueError):
    """A results directory cannot be read at all, or one of its files is corrupt."""


Point = tuple[float, float]


@dataclass
class Run:
    """Everything the report needs from one results directory."""

    path: Path
    name: str
    config: dict[str, Any] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)
    clients: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)

    @property
    def algorithm(self) -> str:
        return str(self.summary.get("algorithm") or self.config.get("algorithm") or "unknown")

    @property
    def dataset(self) -> str:
        return str(self.summary.get("dataset") or self.config.get("dataset") or "unknown")

    @property
    def label(self) -> str:
        return f"{self.name} ({self.algorithm})"

    @property
    def status(self) -> str:
        if SUMMARY in self.missing:
            return "unknown (no summary.json: the run may be unfinished or was interrupted)"
        return str(self.summary.get("status") or "unknown")

    @property
    def final(self) -> dict[str, Any]:
        return _section(self.summary, "final")

    @property
    def last_round(self) -> int | None:
        rounds = [r for row in self.rows if (r := _as_int(row.get("round"))) is not None]
        return max(rounds) if rounds else None

    def total_seconds(self) -> float | None:
        seconds = _number(self.summary.get("seconds"))
        if seconds is not None:
            return seconds
        per_round = [s for row in self.rows if (s := _number(row.get("seconds"))) is not None]
        return sum(per_round) if per_round else None


# ---- reading -------------------------------------------------------------------------------
def _read_json(path: Path) -> dict[str, Any]:
    try:
        obj = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportError(f"{path}: cannot read: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise ReportError(f"{path}: invalid JSON at line {exc.lineno}: {exc.msg}") from exc
    if not isinstance(obj, dict):
        raise ReportError(f"{path}: expected a JSON object, found {type(obj).__name__}")
    return obj


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportError(f"{path}: cannot read: {exc}") from exc
    rows: list[dict[str, Any]] = []
    numbered = [(n, line) for n, line in enumerate(text.splitlines(), start=1) if line.strip()]
    for i, (lineno, line) in enumerate(numbered):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            if i == len(numbered) - 1:  # what a crash mid-write leaves: use the lines before
                print(
                    f"pollen: warning: {path}: line {lineno} is incomplete (cut off "
                    f"mid-write); reporting the {len(rows)} complete lines",
                    file=sys.stderr,
                )
                break
            raise ReportError(f"{path}: line {lineno}: invalid JSON: {exc.msg}") from exc
        if not isinstance(obj, dict):
            raise ReportError(
                f"{path}: line {lineno}: expected a JSON object, found {type(obj).__name__}"
            )
        rows.append(obj)
    return rows


def load_run(path: Path, name: str | None = None) -> Run:
    """Read one results directory; raises ReportError when there is nothing to report on."""
    if not path.is_dir():
        raise ReportError(f"{path}: no such results directory")
    present = [f for f in RESULT_FILES if (path / f).is_file()]
    if not present:
        raise ReportError(f"{path}: not a results directory (none of {', '.join(RESULT_FILES)})")
    run = Run(path=path, name=name or _dir_name(path))
    run.missing = [f for f in RESULT_FILES if f not in present]
    if CONFIG in present:
        run.config = _read_json(path / CONFIG)
    if SUMMARY in present:
        run.summary = _read_json(path / SUMMARY)
    if METRICS in present:
        run.rows = _read_jsonl(path / METRICS)
    if CLIENTS in present:
        run.clients = _read_jsonl(path / CLIENTS)
    return run


def _dir_name(path: Path) -> str:
    return path.resolve().name or str(path)


def _unique_names(paths: Sequence[Path]) -> list[str]:
    """Directory names, widened with parents where two runs would otherwise share a label."""
    base = [_dir_name(p) for p in paths]
    names = [
        "/".join(p.resolve().parts[-2:]) if base.count(n) > 1 else n
        for p, n in zip(paths, base, strict=True)
    ]
    return [n if names.count(n) == 1 else f"{n} #{i + 1}" for i, n in enumerate(names)]


# ---- values --------------------------------------------------------------------------------
def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _as_int(value: Any) -> int | None:
    number = _number(value)
    return int(number) if number is not None and number.is_integer() else None


def _section(obj: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = obj.get(key)
    return value if isinstance(value, dict) else {}


def _row_mb(row: Mapping[str, Any]) -> float | None:
    parts = [_number(row.get(k)) for k in ("bytes-sent", "bytes-received")]
    values = [v for v in parts if v is not None]
    return sum(values) / 1e6 if values else None


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


# ---- series for plots ----------------------------------------------------------------------
def metric_series(run: Run, suffix: str) -> dict[str, list[Point]]:
    """Per-round values of every metric whose key ends in `suffix`, keyed "clients KEY" or
    "server KEY".

    Clients' test-* metrics of round r evaluate the model they received, i.e. the one after
    round r-1's aggregation, so they are placed at r-1 to line up with the server's evaluation
    of the same model; the final client evaluation (after the last round) is appended at the
    last round.
    """
    series: dict[str, list[Point]] = {}
    for row in run.rows:
        rnd = _number(row.get("round"))
        if rnd is None:
            continue
        for section, who in SECTIONS:
            for key, value in _section(row, section).items():
                y = _number(value)
                if y is None or not str(key).endswith(suffix):
                    continue
                shifted = section == "train" and str(key).startswith("test-")
                series.setdefault(f"{who} {key}", []).append((rnd - 1 if shifted else rnd, y))
    last = run.last_round
    if last is not None:
        for key, value in _section(run.final, "eval").items():
            y = _number(value)
            if y is not None and str(key).startswith("test-") and f"clients {key}" in series:
                series[f"clients {key}"].append((float(last), y))
    return {k: sorted(v) for k, v in series.items()}


def _row_series(run: Run, value: Callable[[Mapping[str, Any]], float | None]) -> list[Point]:
    points = []
    for row in run.rows:
        rnd, y = _number(row.get("round")), value(row)
        if rnd is not None and y is not None:
            points.append((rnd, y))
    return sorted(points)


def last_client_accuracies(run: Run) -> tuple[int, list[float]] | None:
    """Per-client test-accuracy in the latest round any client reported one (one per client)."""
    by_round: dict[int, dict[str, float]] = {}
    for row in run.clients:
        rnd = _as_int(row.get("round"))
        acc = _number(_section(row, "metrics").get("test-accuracy"))
        if rnd is not None and acc is not None:
            by_round.setdefault(rnd, {})[str(row.get("client-id"))] = acc
    if not by_round:
        return None
    rnd = max(by_round)
    return rnd, sorted(by_round[rnd].values())


# ---- plotting ------------------------------------------------------------------------------
Line = tuple[Run, int, str, list[Point]]


def _plot_lines(
    path: Path, title: str, ylabel: str, lines: Sequence[Line], xlabel: str = "round"
) -> bool:
    """One line per (run, run index, metric, points): colour per run, dash per metric.
    Returns False, writing nothing, when there are no points at all."""
    lines = [line for line in lines if line[3]]
    if not lines:
        return False
    import matplotlib  # lazy: matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib
    from matplotlib.ticker import MaxNLocator  # lazy: matplotlib

    styles = ["-", "--", ":", "-."]
    fig, ax = plt.subplots(figsize=(8, 5))
    try:
        style_of: dict[str, str] = {}
        for run, run_index, metric, points in lines:
            style = style_of.setdefault(metric, styles[len(style_of) % len(styles)])
            xs, ys = zip(*points, strict=True)
            label = f"{run.label} {metric}" if metric else run.label
            ax.plot(
                xs, ys, style, marker="o", markersize=3, color=f"C{run_index % 10}", label=label
            )
        ax.set_title(title)
        ax.set_xlabel(xlabel)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
    return True


def _plot_client_accuracy(path: Path, runs: Sequence[Run]) -> bool:
    data = [(run, found) for run in runs if (found := last_client_accuracies(run)) is not None]
    if not data:
        return False
    import matplotlib  # lazy: matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib

    fig, ax = plt.subplots(figsize=(max(6.0, 2.5 * len(data)), 5))
    try:
        values = [accs for _, (_, accs) in data]
        positions = list(range(1, len(data) + 1))
        ax.boxplot(
            values,
            positions=positions,
            widths=0.5,
            showfliers=False,
            medianprops={"color": "black"},
        )
        for pos, (i, (run, (_, accs))) in zip(positions, enumerate(data), strict=True):
            run_index = runs.index(run)
            spread = [pos + 0.3 * (j / max(1, len(accs) - 1) - 0.5) for j in range(len(accs))]
            ax.scatter(
                spread,
                accs,
                s=14,
                color=f"C{run_index % 10}",
                zorder=3,
                label=run.label if i < 10 else None,
            )
        ax.set_xticks(positions)
        ax.set_xticklabels(
            [f"{run.label}\nround {rnd}, {len(accs)} clients" for run, (rnd, accs) in data],
            fontsize="small",
        )
        ax.set_title("per-client test-accuracy in the last reported round")
        ax.set_ylabel("test-accuracy")
        ax.grid(True, axis="y", alpha=0.3)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
    return True


def write_plots(runs: Sequence[Run], out: Path) -> list[str]:
    """Write every plot some run has data for; returns the file names written."""
    written = []
    for name, suffix, title in (
        (ACCURACY_PNG, "accuracy", "accuracy"),
        (LOSS_PNG, "loss", "loss"),
        (ENERGY_PNG, "energy", "energy captured"),
        (ERROR_RATIO_PNG, "error-ratio", "reconstruction error / true model's"),
        (SIGMA_PNG, "sigma-mean", "mean sigma"),
    ):
        lines = [
            (run, i, metric, points)
            for i, run in enumerate(runs)
            for metric, points in metric_series(run, suffix).items()
        ]
        xlabel = "round (clients' test figures at the round whose model they evaluate)"
        if _plot_lines(out / name, title, title, lines, xlabel):
            written.append(name)
    seconds = [
        (run, i, "", _row_series(run, lambda row: _number(row.get("seconds"))))
        for i, run in enumerate(runs)
    ]
    if _plot_lines(out / TIME_PNG, "time per round", "seconds", seconds):
        written.append(TIME_PNG)
    traffic = [(run, i, "", _row_series(run, _row_mb)) for i, run in enumerate(runs)]
    if _plot_lines(out / BYTES_PNG, "traffic per round (sent + received)", "MB", traffic):
        written.append(BYTES_PNG)
    if _plot_client_accuracy(out / CLIENT_ACCURACY_PNG, runs):
        written.append(CLIENT_ACCURACY_PNG)
    return written


# ---- Markdown ------------------------------------------------------------------------------
ROUND_COLUMNS: tuple[tuple[str, Callable[[Mapping[str, Any]], Any], int], ...] = (
    ("clients test-accuracy", lambda r: _number(_section(r, "train").get("test-accuracy")), 4),
    (
        "clients test-accuracy-p10",
        lambda r: _number(_section(r, "train").get("test-accuracy-p10")),
        4,
    ),
    ("server test-accuracy", lambda r: _number(_section(r, "server-eval").get("test-accuracy")), 4),
    ("train-loss", lambda r: _number(_section(r, "train").get("train-loss")), 4),
    ("seconds", lambda r: _number(r.get("seconds")), 1),
    ("MB", _row_mb, 4),
)


def _rounds_table(run: Run) -> list[str]:
    columns = [c for c in ROUND_COLUMNS if any(c[1](row) is not None for row in run.rows)]
    header = ["round", *(name for name, _, _ in columns)]
    body = [
        [_fmt(row.get("round")), *(_fmt(get(row), dec) for _, get, dec in columns)]
        for row in run.rows
    ]
    lines = _table(header, body)
    if any(name.startswith("clients test-") for name, _, _ in columns):
        lines += [
            "",
            "Clients' test figures of round r evaluate the model they received at "
            "the start of that round (after round r-1's aggregation).",
        ]
    return lines


def _final_table(run: Run) -> list[str]:
    clients, server = _section(run.final, "eval"), _section(run.final, "server-eval")
    keys = sorted(set(clients) | set(server))
    if not keys:
        return []
    body = [[_cell(k), _fmt(clients.get(k)), _fmt(server.get(k))] for k in keys]
    return ["**Final evaluation**", "", *_table(["metric", "clients", "server"], body)]


def _clients_text(run: Run) -> str:
    configured = _as_int(run.config.get("num-clients"))
    connected = run.summary.get("clients")
    parts = []
    if configured is not None:
        parts.append(f"{configured} configured")
    if isinstance(connected, list):
        parts.append(f"{len(connected)} took part")
    return ", ".join(parts) or MISSING


def _rounds_text(run: Run) -> str:
    planned = _as_int(run.summary.get("rounds")) or _as_int(run.config.get("num-rounds"))
    done = run.last_round
    if done is None:
        done = _as_int(run.summary.get("last-completed-round"))
    if done is None and planned is None:
        return MISSING
    if planned is None:
        return f"{done} recorded"
    return f"{done if done is not None else 0} of {planned} recorded"


def _run_section(run: Run) -> list[str]:
    lines = [f"## {_cell(run.name)}", "", f"- directory: `{run.path}`", f"- status: {run.status}"]
    reason = run.summary.get("reason")
    if reason:
        lines.append(f"- reason: {_cell(str(reason))}")
    seconds = run.total_seconds()
    lines += [
        f"- algorithm: {_cell(run.algorithm)}",
        f"- dataset: {_cell(run.dataset)}",
        f"- clients: {_clients_text(run)}",
        f"- rounds: {_rounds_text(run)}",
        f"- total seconds: {_fmt(seconds, 1) if seconds is not None else MISSING}",
    ]
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
        final = _section(run.final, "eval")
        seconds = run.total_seconds()
        body.append(
            [
                _cell(run.name),
                _cell(run.algorithm),
                _cell(run.status.split(" ")[0]),
                _fmt(_number(final.get("test-accuracy"))),
                _fmt(_number(final.get("test-accuracy-p10"))),
                _fmt(seconds, 1) if seconds is not None else MISSING,
            ]
        )
    header = ["run", "algorithm", "status", "final mean accuracy", "final p10 accuracy", "seconds"]
    return ["## Comparison", "", *_table(header, body), ""]


PLOT_CAPTIONS = {
    ACCURACY_PNG: "Accuracy per round (clients' test figures placed at the round whose model "
    "they evaluate).",
    LOSS_PNG: "Loss per round.",
    ENERGY_PNG: "Energy captured by the reconstructions per round (placed like accuracy).",
    ERROR_RATIO_PNG: "Reconstruction error over the true model's, per round.",
    SIGMA_PNG: "Mean of the learned sigma per round.",
    TIME_PNG: "Seconds per round.",
    BYTES_PNG: "Traffic per round, bytes sent plus received, in MB.",
    CLIENT_ACCURACY_PNG: "Distribution of per-client test-accuracy in the last reported round.",
}


def render_markdown(runs: Sequence[Run], plots: Sequence[str]) -> str:
    lines = ["# Pollen report", ""]
    lines += [f"Runs: {', '.join(_cell(run.label) for run in runs)}.", ""]
    for run in runs:
        lines += _run_section(run)
    if len(runs) > 1:
        lines += _comparison(runs)
    if plots:
        lines += ["## Plots", ""]
        for name in plots:
            lines += [PLOT_CAPTIONS[name], "", f"![{name.removesuffix('.png')}]({name})", ""]
    else:
        lines += ["No plots: no run recorded per-round or per-client metrics.", ""]
    return "\n".join(lines)


def write_report(run_dirs: list[Path], out: Path | None = None) -> Path:
    """Write plots and report.md for the given results directories; returns the report
    directory (default: the first directory's report/)."""
    if not run_dirs:
        raise ReportError("no results directories given")
    paths = [Path(p) for p in run_dirs]
    runs = [load_run(p, name) for p, name in zip(paths, _unique_names(paths), strict=True)]
    out = Path(out) if out is not None else paths[0] / "report"
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name in PLOTS:  # a plot that no longer has data must not linger from an earlier one
            (out / name).unlink(missing_ok=True)
        plots = write_plots(runs, out)
        (out / REPORT_MD).write_text(render_markdown(runs, plots))
    except OSError as exc:
        raise ReportError(f"cannot write the report to {out}: {exc.strerror or exc}") from None
    return out
