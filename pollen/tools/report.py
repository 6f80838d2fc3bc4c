"""Plots, flat CSV files and a Markdown summary of one or more results directories
(`pollen report`), and the plot of a partition (`pollen data summary --plot`).

The files are read defensively: a run that failed early, or is still running, may lack any of
them, and the report says so instead of refusing. Runs whose settings differ only in the seed
are drawn together as their mean ± standard deviation; compared runs that differ in a setting
other than the algorithm (and its own settings) and the seed get a warning. matplotlib is
imported only when plotting, so importing this module stays cheap for the CLI.

What each file holds and how the figures place each value: docs/monitoring.md#reports.
"""

from __future__ import annotations

import csv
import json
import math
import re
import statistics
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pollen.core import runconfig
from pollen.core.rundir import (
    CLIENTS,
    CONFIG,
    METRICS,
    SUMMARY,
    ResultsFileError,
    read_object,
    read_rows,
)

RESULT_FILES = (CONFIG, METRICS, CLIENTS, SUMMARY)

REPORT_MD = "report.md"
METRICS_CSV = "metrics.csv"
CLIENTS_CSV = "clients.csv"
ACCURACY = "accuracy"
LOSS = "loss"
TIME = "time"
BYTES = "bytes"
CLIENT_ACCURACY = "client-accuracy"
# Unsupervised runs (ADEPT): energy captured, error over the true model's, learned sigma
ENERGY = "energy"
ERROR_RATIO = "error-ratio"
SIGMA = "sigma"
EPSILON = "epsilon"
PLOTS = (ACCURACY, LOSS, ENERGY, ERROR_RATIO, SIGMA, EPSILON, TIME, BYTES, CLIENT_ACCURACY)
"""Every plot's file name, without its format's suffix."""
FORMATS = ("png", "svg", "pdf")
"""What `--format` may ask for; the Markdown shows the PNG (else the SVG)."""

# Sections of a metrics.jsonl row and how the report names them.
SECTIONS = (("train", "clients"), ("server-eval", "server"))
MISSING = "–"

HOW_IT_RAN = frozenset(
    {
        "seed",
        "out-dir",
        "run-name",
        "resume",
        "data-dir",
        "cache-dir",
        "client-state-dir",
        "download",
        "device",
        "poll-interval",
        "phase-timeout",
        "resend-limit",
        "wait-for-clients",
        "simulation-nodes",
        "client-timing",
        "server-blas-threads",
    }
)
"""Settings that say where and how a run ran, not what it computed (and the seed): runs that
differ only in these are repetitions of one experiment."""


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
    def seed(self) -> int | None:
        return _as_int(self.config.get("seed"))

    @property
    def label(self) -> str:
        """The directory's name, and the algorithm when the name does not say it."""
        if self.algorithm == "unknown" or self.algorithm in self.name:
            return self.name
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
    def planned_rounds(self) -> int | None:
        return _as_int(self.summary.get("rounds")) or _as_int(self.config.get("num-rounds"))

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

    def is_final(self, rnd: int) -> bool:
        """Whether clients.jsonl's round `rnd` is the final evaluation (written as round N+1)."""
        planned = self.planned_rounds
        return planned is not None and rnd > planned

    def settings(self) -> dict[str, Any]:
        """The settings that say what the run computed (config.json without HOW_IT_RAN)."""
        return {k: v for k, v in self.config.items() if k not in HOW_IT_RAN}


# ---- reading -------------------------------------------------------------------------------
def _read_json(path: Path) -> dict[str, Any]:
    try:
        return read_object(path)
    except ResultsFileError as exc:
        raise ReportError(str(exc)) from exc


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    try:
        got = read_rows(path)
    except ResultsFileError as exc:
        raise ReportError(str(exc)) from exc
    if got.cut_line is not None:  # what a crash mid-write leaves: use the lines before
        print(
            f"pollen: warning: {path}: line {got.cut_line} is incomplete (cut off "
            f"mid-write); reporting the {len(got.rows)} complete lines",
            file=sys.stderr,
        )
    return got.rows


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


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


# ---- settings: what a run is, which runs repeat one another ---------------------------------
PARTITION_PARAMETER = {
    "dirichlet": ("dirichlet-alpha", "α={}"),
    "classes": ("classes-per-client", "{} classes per client"),
    "one-class": ("classes-per-client", "{} classes per client"),
    "label-groups": ("label-groups", "{} label groups"),
    "pachinko": ("pachinko-beta", "β={}"),
}


def partition_text(config: Mapping[str, Any]) -> str | None:
    """`dirichlet α=0.3`, `iid`, ... from a run's config (None when it has none)."""
    partitioner = config.get("partitioner")
    if not isinstance(partitioner, str):
        return None
    key, text = PARTITION_PARAMETER.get(partitioner, ("", ""))
    value = config.get(key)
    if not key or value is None:
        return partitioner
    return f"{partitioner} {text.format(f'{value:g}' if isinstance(value, float) else value)}"


def setting_text(runs: Sequence[Run]) -> str:
    """What the runs share: `digits, dirichlet α=0.3, 5 clients` (the parts they agree on)."""
    parts = []
    for get in (
        lambda r: r.dataset if r.dataset != "unknown" else None,
        lambda r: partition_text(r.config),
        lambda r: f"{n} clients" if (n := _as_int(r.config.get("num-clients"))) else None,
    ):
        values = {get(run) for run in runs}
        if len(values) == 1 and (value := values.pop()):
            parts.append(value)
    return ", ".join(parts)


@dataclass
class Group:
    """Runs with the same settings but for the seed (one run, or the seeds of one setting)."""

    runs: list[Run]
    label: str = ""

    @property
    def seeds(self) -> list[int]:
        return sorted(s for r in self.runs if (s := r.seed) is not None)

    @property
    def banded(self) -> bool:
        return len(self.runs) > 1

    @property
    def over(self) -> str:
        """`3 seeds` (or `3 runs` when some share a seed)."""
        n = len(self.runs)
        return f"{n} seeds" if len(set(self.seeds)) == n else f"{n} runs"


def group_runs(runs: Sequence[Run]) -> list[Group]:
    """Runs whose settings agree except for the seed and HOW_IT_RAN, in order of first
    appearance. A run without config.json stands alone."""
    groups: list[Group] = []
    keys: list[str | None] = []
    for run in runs:
        key = json.dumps(run.settings(), sort_keys=True, default=str) if run.config else None
        if key is not None and key in keys:
            groups[keys.index(key)].runs.append(run)
            continue
        keys.append(key)
        groups.append(Group([run]))
    for group in groups:
        group.label = _group_label(group)
    return groups


SEED_SUFFIX = re.compile(r"[-_ ./#]*(seed)?[-_ ]*$", re.IGNORECASE)


def _group_label(group: Group) -> str:
    """A run's label; for seeds, what their names share (`fedavg-seed0`, `fedavg-seed1`:
    `fedavg`), else the algorithm."""
    if not group.banded:
        return group.runs[0].label
    names = [r.name for r in group.runs]
    prefix = names[0]
    for name in names[1:]:
        while not name.startswith(prefix):
            prefix = prefix[:-1]
    algorithm = group.runs[0].algorithm
    label = SEED_SUFFIX.sub("", prefix) or algorithm
    return label if algorithm in label or algorithm == "unknown" else f"{label} ({algorithm})"


def differing_settings(runs: Sequence[Run]) -> dict[str, list[Any]]:
    """Settings in which the runs differ, other than the seed, HOW_IT_RAN, the algorithm and
    the settings of an algorithm some of them do not run: {key: the values, in run order}."""
    with_config = [r for r in runs if r.config]
    if len(with_config) < 2:
        return {}
    keys = set.intersection(*(set(r.settings()) for r in with_config)) - {"algorithm"}
    algorithms = {r.algorithm for r in with_config}
    own: set[str] = set()
    for algorithm in algorithms:
        own |= set(runconfig.foreign_settings(algorithm, keys))
    out = {}
    for key in sorted(keys - own):
        values = [r.config[key] for r in with_config]
        if any(v != values[0] for v in values):
            out[key] = values
    return out


def settings_warning(runs: Sequence[Run]) -> str | None:
    differ = differing_settings(runs)
    if not differ:
        return None
    named = [r for r in runs if r.config]
    parts = []
    for key, values in differ.items():
        holders: dict[str, list[str]] = {}  # each value with the runs that have it
        for value, run in zip(values, named, strict=True):
            holders.setdefault(repr(value), []).append(run.name)
        parts.append(f"{key}: " + ", ".join(f"{v} ({', '.join(n)})" for v, n in holders.items()))
    detail = "; ".join(parts)
    return (
        f"the compared runs differ in settings other than the algorithm and the seed: {detail}"
    )


# ---- series for plots ----------------------------------------------------------------------
def _plotted(key: str, suffix: str) -> bool:
    """Keys a figure draws: those ending in `suffix`, and their 10th percentile over clients
    (-p10); not the worst client's (-min, -max), which the CSV files keep."""
    return key.endswith((suffix, f"{suffix}-p10"))


def metric_series(run: Run, suffix: str) -> dict[str, list[Point]]:
    """Per-round values of every metric whose key ends in `suffix`, keyed "clients KEY" or
    "server KEY".

    The x of a value is the round whose aggregated model it describes (0: the initial model,
    pollen.core.runconfig.model_round): clients' test metrics of round r evaluate the model they
    received, the one after round r-1's aggregation, so they are placed at r-1 to line up with
    the server's evaluation of the same model (an algorithm that tests after its local
    training, Local, at r); the clients' final evaluation (after the last round) is placed at
    the last round (`final_points`), where it replaces a value of the same model.
    """
    series: dict[str, dict[float, float]] = {}
    for row in run.rows:
        rnd = _as_int(row.get("round"))
        if rnd is None:
            continue
        for section, who in SECTIONS:
            for key, value in _section(row, section).items():
                y = _number(value)
                if y is None or not _plotted(str(key), suffix):
                    continue
                x = runconfig.model_round(run.algorithm, str(key), rnd) if who == "clients" else rnd
                series.setdefault(f"{who} {key}", {})[float(x)] = y
    for name, (fx, fy) in final_points(run, suffix).items():
        if name in series:
            series[name][fx] = fy
    return {k: sorted(v.items()) for k, v in series.items()}


def final_points(run: Run, suffix: str) -> dict[str, Point]:
    """The clients' final evaluation, at the last round: {"clients KEY": (round, value)}."""
    last = run.last_round
    if last is None:
        return {}
    out = {}
    for key, value in _section(run.final, "eval").items():
        y = _number(value)
        if y is not None and str(key).startswith("test-") and _plotted(str(key), suffix):
            out[f"clients {key}"] = (float(last), y)
    return out


def _row_series(run: Run, value: Callable[[Mapping[str, Any]], float | None]) -> list[Point]:
    points = []
    for row in run.rows:
        rnd, y = _number(row.get("round")), value(row)
        if rnd is not None and y is not None:
            points.append((rnd, y))
    return sorted(points)


def band(series: Sequence[Sequence[Point]]) -> list[tuple[float, float, float, int]]:
    """(x, mean, std, runs) at every x at least two of the runs have a value for (the std of
    one value would be no spread at all)."""
    by_x: dict[float, list[float]] = {}
    for points in series:
        for x, y in points:
            by_x.setdefault(x, []).append(y)
    out = []
    for x in sorted(by_x):
        values = by_x[x]
        if len(values) >= 2 or len(series) == 1:
            mean, std = _mean_std(values)
            out.append((x, mean, std, len(values)))
    return out


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
SERVER_STYLE: dict[str, Any] = {
    # hollow squares on a dashed line, drawn above the clients' lines: where clients and server
    # evaluate the same model to the same figure, both stay visible
    "linestyle": "--",
    "marker": "s",
    "markersize": 7,
    "markerfacecolor": "none",
    "markeredgewidth": 1.4,
    "zorder": 3,
}
CLIENT_STYLES: tuple[dict[str, Any], ...] = (
    {"linestyle": "-", "marker": "o", "markersize": 4, "zorder": 2},  # the mean
    {"linestyle": ":", "marker": "v", "markersize": 4, "zorder": 2},  # the 10th percentile
    {"linestyle": "-.", "marker": "^", "markersize": 4, "zorder": 2},  # another metric
)
BAND_ALPHA = 0.18


def _single_colours(metrics: Sequence[str]) -> dict[str, str]:
    """Colours of one group's series: the server's red, the clients' from blue on, a 10th
    percentile in the colour of its mean."""
    out: dict[str, str] = {}
    free = iter(["C0", "C2", "C4", "C1", "C5", "C6", "C7", "C8", "C9"] * 3)
    for metric in metrics:
        who, _, key = metric.partition(" ")
        if who == "server":
            out[metric] = "C3"
        elif key.endswith("-p10") and f"clients {key.removesuffix('-p10')}" in out:
            out[metric] = out[f"clients {key.removesuffix('-p10')}"]
        else:
            out[metric] = next(free)
    return out


def _series_style(metric: str) -> tuple[dict[str, Any], str]:
    """The line style and legend text of a series "clients KEY" or "server KEY"."""
    who, _, key = metric.partition(" ")
    if who == "server":
        return SERVER_STYLE, f"server: {key}"
    if key.endswith("-p10"):
        return CLIENT_STYLES[1], f"clients: {key.removesuffix('-p10')} (10th percentile)"
    index = 0 if key.startswith("test-") or len(key.split("-")) == 1 else 2
    if key.startswith(("test-", "train-")):  # the weighted mean (strategies/aggregate.py)
        return CLIENT_STYLES[index], f"clients: {key} (mean over clients)"
    return CLIENT_STYLES[index], f"clients: {key}"  # a strategy's own (a ledger's max)


@contextmanager
def _figure(width: float = 7.0, height: float = 4.3) -> Iterator[tuple[Any, Any]]:
    import matplotlib  # lazy: matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib

    # text stays text in SVG and TrueType in PDF (journals refuse Type 3 fonts)
    style: dict[Any, Any] = {"svg.fonttype": "none", "pdf.fonttype": 42, "ps.fonttype": 42}
    with plt.rc_context(style):
        fig, ax = plt.subplots(figsize=(width, height))
        try:
            yield fig, ax
        finally:
            plt.close(fig)


def _save(fig: Any, out: Path, name: str, formats: Sequence[str]) -> None:
    fig.tight_layout()
    for fmt in formats:
        fig.savefig(out / f"{name}.{fmt}", dpi=150)


FINAL_LABEL = "final evaluation (clients)"


def _legend(ax: Any, entries: int) -> None:
    """The legend, the final evaluation's star last; beside the plot when it is long."""
    handles, labels = ax.get_legend_handles_labels()
    order = sorted(range(len(labels)), key=lambda i: labels[i] == FINAL_LABEL)
    handles, labels = [handles[i] for i in order], [labels[i] for i in order]
    if entries > 6:
        ax.legend(handles, labels, fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
    else:
        ax.legend(handles, labels, fontsize="small")


def _plot_metric(
    out: Path,
    name: str,
    title: str,
    suffix: str,
    groups: Sequence[Group],
    formats: Sequence[str],
    setting: str,
) -> bool:
    """One figure of every series ending in `suffix`: a colour per series for one group, a
    colour per group for several; a style per series (the server's hollow squares on a dashed
    line); a band of ± std for a group of seeds; the clients' final evaluation marked by a
    star. False, writing nothing, without data."""
    per_group = [
        (group, [metric_series(run, suffix) for run in group.runs]) for group in groups
    ]
    # the clients' series first, the server's last (drawn on top)
    metrics = sorted(
        {m for _, runs in per_group for series in runs for m in series},
        key=lambda m: (m.startswith("server"), m),
    )
    if not metrics:
        return False
    single = len(groups) == 1
    with _figure() if single else _figure(9.5, 4.3) as (fig, ax):
        entries = 0
        final_marked = False
        colours = _single_colours(metrics)
        for gi, (group, runs) in enumerate(per_group):
            for metric in metrics:
                tracks = [series[metric] for series in runs if series.get(metric)]
                if not tracks:
                    continue
                style, text = _series_style(metric)
                colour = colours[metric] if single else f"C{gi % 10}"
                label: str | None = text if single else None  # several: two legends below
                if label is not None and group.banded:
                    label += f"; mean ± std over {group.over}"
                rows = band(tracks)
                xs = [r[0] for r in rows]
                ys = [r[1] for r in rows]
                ax.plot(xs, ys, color=colour, label=label, **style)
                entries += 1
                if group.banded:
                    lo = [m - s for _, m, s, _ in rows]
                    hi = [m + s for _, m, s, _ in rows]
                    ax.fill_between(xs, lo, hi, color=colour, alpha=BAND_ALPHA, linewidth=0)
                finals = [final_points(run, suffix).get(metric) for run in group.runs]
                found = [p for p in finals if p is not None]
                if found:
                    fx = found[0][0]
                    fy = statistics.fmean(p[1] for p in found)
                    ax.plot(
                        [fx], [fy], linestyle="none", marker="*", markersize=13, color=colour,
                        markeredgecolor="black", markeredgewidth=0.6, zorder=4,
                        label=None if final_marked or not single else FINAL_LABEL,
                    )  # fmt: skip
                    entries += 0 if final_marked else 1
                    final_marked = True
        ax.set_title(_title(title, setting))
        ax.set_xlabel("round (the model after that round's aggregation; 0: the initial model)")
        ax.set_ylabel(title)
        _integer_ticks(ax)
        ax.grid(True, alpha=0.3)
        if single:
            _legend(ax, entries)
        else:
            _two_legends(ax, groups, metrics, final_marked)
        _save(fig, out, name, formats)
    return True


def _two_legends(
    ax: Any, groups: Sequence[Group], metrics: Sequence[str], final: bool
) -> None:
    """Beside the plot: the runs by colour (with their seeds), and the series by style."""
    from matplotlib.lines import Line2D  # lazy: matplotlib

    runs = [
        Line2D([], [], color=f"C{gi % 10}", linewidth=2.5)
        for gi in range(len(groups))
    ]  # fmt: skip
    names = [
        g.label + (f" (mean ± std over {g.over})" if g.banded else "") for g in groups
    ]  # fmt: skip
    first = ax.legend(runs, names, title="runs", fontsize="small", title_fontsize="small",
                      loc="upper left", bbox_to_anchor=(1.01, 1.0))  # fmt: skip
    ax.add_artist(first)
    styles = [_series_style(m) for m in metrics]
    handles = [Line2D([], [], color="black", **style) for style, _ in styles]
    texts = [text for _, text in styles]
    if final:
        handles.append(Line2D([], [], linestyle="none", marker="*", markersize=11,
                              color="white", markeredgecolor="black"))  # fmt: skip
        texts.append(FINAL_LABEL)
    ax.legend(handles, texts, title="series", fontsize="small", title_fontsize="small",
              loc="lower left", bbox_to_anchor=(1.01, 0.0))  # fmt: skip


def _title(what: str, setting: str) -> str:
    """`Test accuracy: digits, iid, 5 clients`, on two lines when that is long."""
    head = f"{what[0].upper()}{what[1:]}"
    if not setting:
        return head
    return f"{head}\n{setting}" if len(head) + len(setting) > 55 else f"{head}: {setting}"


def _integer_ticks(ax: Any) -> None:
    from matplotlib.ticker import MaxNLocator  # lazy: matplotlib

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _plot_rows(
    out: Path,
    name: str,
    title: str,
    ylabel: str,
    groups: Sequence[Group],
    value: Callable[[Mapping[str, Any]], float | None],
    formats: Sequence[str],
    setting: str,
) -> bool:
    """A per-round quantity of the rows (seconds, MB): a line per group, bands for seeds."""
    tracks = [(g, [p for run in g.runs if (p := _row_series(run, value))]) for g in groups]
    tracks = [(g, t) for g, t in tracks if t]
    if not tracks:
        return False
    with _figure() as (fig, ax):
        for gi, (group, series) in enumerate(tracks):
            rows = band(series)
            xs = [r[0] for r in rows]
            colour = f"C{gi % 10}"
            label = group.label + (f" (mean ± std over {group.over})" if group.banded else "")
            ax.plot(xs, [r[1] for r in rows], "-o", markersize=3, color=colour, label=label)
            if group.banded:
                lo = [m - s for _, m, s, _ in rows]
                hi = [m + s for _, m, s, _ in rows]
                ax.fill_between(xs, lo, hi, color=colour, alpha=BAND_ALPHA, linewidth=0)
        ax.set_title(_title(title, setting))
        ax.set_xlabel("round")
        ax.set_ylabel(ylabel)
        top = max(ax.get_ylim()[1], 1e-9)  # seconds and bytes: from zero, sizes compare;
        ax.set_ylim(-0.03 * top, top)  # a line at zero (Local's traffic) stays visible
        _integer_ticks(ax)
        ax.grid(True, alpha=0.3)
        _legend(ax, len(tracks))
        _save(fig, out, name, formats)
    return True


def _plot_client_accuracy(
    out: Path, groups: Sequence[Group], formats: Sequence[str], setting: str
) -> bool:
    """A box per run, or per setting over its seeds, of the clients' test-accuracy in the
    final evaluation (or the last round reported), each client a dot in the setting's colour."""
    boxes = []  # (group index, tick label, values, whether every run's is the final evaluation)
    for gi, group in enumerate(groups):
        found = [(run, f) for run in group.runs if (f := last_client_accuracies(run)) is not None]
        if not found:
            continue
        values = [acc for _, (_, accs) in found for acc in accs]
        final = all(run.is_final(rnd) for run, (rnd, _) in found)
        when = "final" if final else ", ".join(sorted({_round_name(r, n) for r, (n, _) in found}))
        if len(found) > 1:
            clients = {len(accs) for _, (_, accs) in found}
            each = f"{clients.pop()} clients" if len(clients) == 1 else "clients"
            tick = f"{group.label}\n{when}, {len(found)} {group.over.split()[1]} x {each}"
        else:
            tick = f"{group.label}\n{when}, {len(values)} clients"
        boxes.append((gi, tick, values, final))
    if not boxes:
        return False
    with _figure(max(6.0, 1.8 * len(boxes) + 1.5), 4.3) as (fig, ax):
        positions = list(range(1, len(boxes) + 1))
        ax.boxplot(
            [values for _, _, values, _ in boxes], positions=positions, widths=0.5,
            showfliers=False, medianprops={"color": "black"},
        )  # fmt: skip
        for pos, (gi, _, values, _) in zip(positions, boxes, strict=True):
            spread = [pos + 0.3 * (j / max(1, len(values) - 1) - 0.5) for j in range(len(values))]
            ax.scatter(spread, values, s=14, color=f"C{gi % 10}", zorder=3)
        ax.set_xticks(positions)
        ax.set_xticklabels([tick for _, tick, _, _ in boxes], fontsize="small")
        when = "final evaluation" if all(b[3] for b in boxes) else "last reported round"
        ax.set_title(_title(f"per-client test-accuracy, {when}", setting))
        ax.set_ylabel("test-accuracy")
        ax.grid(True, axis="y", alpha=0.3)
        _save(fig, out, CLIENT_ACCURACY, formats)
    return True


def _round_name(run: Run, rnd: int) -> str:
    return "final" if run.is_final(rnd) else f"round {rnd}"


def _row_seconds(row: Mapping[str, Any]) -> float | None:
    return _number(row.get("seconds"))


def write_plots(runs: Sequence[Run], out: Path, formats: Sequence[str] = ("png",)) -> list[str]:
    """Write every plot some run has data for, in each format; returns the plots' names
    (without suffix)."""
    groups = group_runs(runs)
    setting = setting_text(runs)
    written = []
    for name, suffix, title in (
        (ACCURACY, "accuracy", "test accuracy"),
        (LOSS, "loss", "loss"),
        (ENERGY, "energy", "energy captured"),
        (ERROR_RATIO, "error-ratio", "reconstruction error / true model's"),
        (SIGMA, "sigma-mean", "mean sigma"),
        (EPSILON, "epsilon", "privacy spent (epsilon)"),
    ):
        if _plot_metric(out, name, title, suffix, groups, formats, setting):
            written.append(name)
    if _plot_rows(out, TIME, "time per round", "seconds", groups, _row_seconds, formats, setting):
        written.append(TIME)
    if _plot_rows(out, BYTES, "traffic per round (sent + received)", "MB", groups, _row_mb,
                  formats, setting):  # fmt: skip
        written.append(BYTES)
    if _plot_client_accuracy(out, groups, formats, setting):
        written.append(CLIENT_ACCURACY)
    return written


def plot_partition(
    summary: Mapping[str, Any], path: Path, title: str = "", split: str = "train"
) -> None:
    """The label distribution per client of a partition (`pollen data summary`'s JSON): a
    stacked bar per client, a colour per label, each segment's count written in it where it
    fits."""
    clients = [c for c in summary.get("clients", []) if isinstance(c, Mapping)]
    counts = [list(c.get(f"{split}_labels") or []) for c in clients]
    if not counts or not any(counts):
        raise ReportError(f"the partition has no {split} label counts to plot")
    labels = max(len(c) for c in counts)
    counts = [c + [0] * (labels - len(c)) for c in counts]
    ids = [str(c.get("client_id", i)) for i, c in enumerate(clients)]
    with _figure(max(6.0, min(0.45 * len(ids) + 2.5, 24.0)), 4.8) as (fig, ax):
        import matplotlib.pyplot as plt  # lazy: matplotlib

        cmap = plt.get_cmap("tab10" if labels <= 10 else "tab20" if labels <= 20 else "turbo")
        colours = [cmap(i / max(1, labels - 1)) if labels > 20 else cmap(i) for i in range(labels)]
        bottom = [0] * len(ids)
        tallest = max(sum(c) for c in counts)
        for label in range(labels):
            heights = [c[label] for c in counts]
            if not any(heights):
                continue
            bars = ax.bar(ids, heights, bottom=bottom, color=colours[label], label=str(label),
                          edgecolor="white", linewidth=0.4)  # fmt: skip
            for bar, h, b in zip(bars, heights, bottom, strict=True):
                if h and h >= 0.035 * tallest and len(ids) <= 40:
                    ax.text(bar.get_x() + bar.get_width() / 2, b + h / 2, str(h),
                            ha="center", va="center", fontsize=6.5)  # fmt: skip
            bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
        ax.set_xlabel("client")
        ax.set_ylabel(f"{split} examples")
        ax.set_title(title or f"label distribution per client ({split} split)")
        if len(ids) > 30:
            ax.set_xticks(range(0, len(ids), max(1, len(ids) // 30)))
        ax.legend(title="label", fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0),
                  ncol=1 if labels <= 20 else 2)  # fmt: skip
        fig.tight_layout()
        fig.savefig(path, dpi=150)


# ---- flat files ----------------------------------------------------------------------------
RUN_COLUMNS = ("run", "algorithm", "dataset", "seed")
ROUND_COLUMNS_CSV = ("round", "stage", "seconds", "bytes-sent", "bytes-received")


def _run_cells(run: Run) -> dict[str, Any]:
    return {"run": run.name, "algorithm": run.algorithm, "dataset": run.dataset, "seed": run.seed}


def metrics_table(runs: Sequence[Run]) -> tuple[list[str], list[dict[str, Any]]]:
    """metrics.csv: a row per run and round (stage `round`) and one for the final evaluation
    (stage `final`, at the last round), metrics as `clients.KEY` and `server.KEY`."""
    rows: list[dict[str, Any]] = []
    for run in runs:
        for row in run.rows:
            cells = {**_run_cells(run), "round": _as_int(row.get("round")), "stage": "round"}
            for key in ROUND_COLUMNS_CSV[2:]:
                cells[key] = row.get(key) if _number(row.get(key)) is not None else None
            for section, who in SECTIONS:
                for key, value in _section(row, section).items():
                    if _number(value) is not None:
                        cells[f"{who}.{key}"] = value
            rows.append(cells)
        final = run.final
        if _section(final, "eval") or _section(final, "server-eval"):
            cells = {**_run_cells(run), "round": run.last_round, "stage": "final"}
            for section, who in (("eval", "clients"), ("server-eval", "server")):
                for key, value in _section(final, section).items():
                    if _number(value) is not None:
                        cells[f"{who}.{key}"] = value
            rows.append(cells)
    metric_cols = sorted({k for r in rows for k in r} - set(RUN_COLUMNS) - set(ROUND_COLUMNS_CSV))
    return [*RUN_COLUMNS, *ROUND_COLUMNS_CSV, *metric_cols], rows


def clients_table(runs: Sequence[Run]) -> tuple[list[str], list[dict[str, Any]]]:
    """clients.csv: a row per client reply with metrics (clients.jsonl), flat; the final
    evaluation's replies (written as round N+1) have stage `final` and round N."""
    rows: list[dict[str, Any]] = []
    for run in runs:
        for row in run.clients:
            rnd = _as_int(row.get("round"))
            final = rnd is not None and run.is_final(rnd)
            cells = {
                **_run_cells(run),
                "round": run.planned_rounds if final else rnd,
                "stage": "final" if final else "round",
                "client-id": _as_int(row.get("client-id")),
                "phase": row.get("phase"),
            }
            for key, value in _section(row, "metrics").items():
                if _number(value) is not None:
                    cells[str(key)] = value
            rows.append(cells)
    head = [*RUN_COLUMNS, "round", "stage", "client-id", "phase"]
    return head + sorted({k for r in rows for k in r} - set(head)), rows


def _write_csv(path: Path, table: tuple[list[str], list[dict[str, Any]]]) -> bool:
    columns, rows = table
    if not rows:
        return False
    with open(path, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns, restval="")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if v is None else v) for k, v in row.items()})
    return True


def write_tables(runs: Sequence[Run], out: Path) -> list[str]:
    """metrics.csv and clients.csv (each only when it has a row); returns the names written."""
    tables = ((METRICS_CSV, metrics_table(runs)), (CLIENTS_CSV, clients_table(runs)))
    return [name for name, table in tables if _write_csv(out / name, table)]


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
    ("epsilon", lambda r: _number(_section(r, "train").get("epsilon")), 3),
    ("client-epsilon", lambda r: _number(_section(r, "train").get("client-epsilon")), 3),
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
    planned = run.planned_rounds
    done = run.last_round
    if done is None:
        done = _as_int(run.summary.get("last-completed-round"))
    if done is None and planned is None:
        return MISSING
    if planned is None:
        return f"{done} recorded"
    return f"{done if done is not None else 0} of {planned} recorded"


def _threat_lines(summary: Mapping[str, Any]) -> list[str]:
    """The robust rule and the simulated attack a run's summary names (docs/robustness.md)."""
    lines = []
    robust = summary.get("robust")
    if isinstance(robust, Mapping):
        shown = ", ".join(f"{k}={_cell(str(v))}" for k, v in sorted(robust.items()))
        lines.append(f"- robust aggregation: {shown}")
    attack = summary.get("attack")
    if isinstance(attack, Mapping):
        lines.append(
            f"- **simulated attack**: clients {_cell(str(attack.get('clients')))} act as "
            f"{_cell(str(attack.get('kind')))}"
        )
    return lines + _privacy_lines(summary)


def _privacy_lines(summary: Mapping[str, Any]) -> list[str]:
    """Each differential-privacy guarantee a run's summary states, with what it protects
    (docs/privacy.md): client-level DP, and DP-SGD's example-level DP."""
    privacy = summary.get("privacy")
    if not isinstance(privacy, Mapping):
        return []
    lines = []
    labels = {"client-level": "client-level DP", "example-level": "example-level DP"}
    for key in [*labels, *sorted(set(privacy) - set(labels))]:
        label = labels.get(key, f"{key} DP")
        entry = privacy.get(key)
        if not isinstance(entry, Mapping):
            continue
        eps = _number(entry.get("epsilon"))
        spent = "no guarantee" if eps is not None and eps < 0 else f"epsilon {_fmt(eps, 3)}"
        how = [f"{k} {_cell(str(entry[k]))}" for k in ("mechanism", "noise-multiplier", "clip",
               "noise-at", "sample-rate") if k in entry]  # fmt: skip
        if entry.get("adaptive-clipping"):
            how.append("adaptive clipping")
        lines.append(
            f"- {label}: {spent} at delta {_cell(str(entry.get('delta')))} "
            f"({', '.join(how)}); protects {_cell(str(entry.get('protects')))}"
        )
    return lines


def _run_section(run: Run) -> list[str]:
    lines = [f"## {_cell(run.name)}", "", f"- directory: `{run.path}`", f"- status: {run.status}"]
    reason = run.summary.get("reason")
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


def _seeds_table(groups: Sequence[Group]) -> list[str]:
    banded = [g for g in groups if g.banded]
    if not banded:
        return []
    keys = ("test-accuracy", "test-accuracy-p10")
    body = []
    for group in banded:
        cells = [_cell(group.label), ", ".join(str(s) for s in group.seeds) or MISSING]
        for key in keys:
            values = [
                v for r in group.runs if (v := _number(_section(r.final, "eval").get(key)))
                is not None
            ]  # fmt: skip
            if values:
                mean, std = _mean_std(values)
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
    "is the clients' final evaluation.",
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
    run_dirs: list[Path], out: Path | None = None, formats: Sequence[str] = ("png",)
) -> Path:
    """Write plots, CSV files and report.md for the given results directories; returns the
    report directory (default: the first directory's report/). A warning line goes to stderr
    when the runs differ in settings other than the algorithm and the seed."""
    if not run_dirs:
        raise ReportError("no results directories given")
    paths = [Path(p) for p in run_dirs]
    runs = [load_run(p, name) for p, name in zip(paths, _unique_names(paths), strict=True)]
    out = Path(out) if out is not None else paths[0] / "report"
    warning = settings_warning(runs)
    if warning:
        print(f"pollen: warning: {warning}", file=sys.stderr)
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name in PLOTS:  # a plot that no longer has data must not linger from an earlier one
            for fmt in FORMATS:
                (out / f"{name}.{fmt}").unlink(missing_ok=True)
        for stale in (METRICS_CSV, CLIENTS_CSV):
            (out / stale).unlink(missing_ok=True)
        plots = write_plots(runs, out, formats)
        files = write_tables(runs, out)
        (out / REPORT_MD).write_text(render_markdown(runs, plots, formats, warning, files))
    except OSError as exc:
        raise ReportError(f"cannot write the report to {out}: {exc.strerror or exc}") from None
    return out
