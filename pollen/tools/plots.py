"""The plots of `pollen report` (per-round metrics, accuracy also against time, time, traffic,
the clients' accuracy) and of a partition (`pollen data summary --plot`), with matplotlib; the
series they draw from a Run. matplotlib is imported only when plotting, so importing this module
stays cheap for the CLI.

How the figures place each value: docs/monitoring.md#reports.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pollen.core import runconfig
from pollen.core.rundir import RoundRow
from pollen.tools.runs import (
    CLOCK_VIRTUAL,
    CLOCK_WALL,
    Group,
    ReportError,
    Run,
    as_number,
    group_runs,
    mean_std,
    row_mb,
    sections,
    setting_text,
)

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

Point = tuple[float, float]


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
        rnd = row.round
        for section, who in sections(row):
            for key, value in section.items():
                y = as_number(value)
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
    for key, value in run.final_eval.items():
        y = as_number(value)
        if y is not None and str(key).startswith("test-") and _plotted(str(key), suffix):
            out[f"clients {key}"] = (float(last), y)
    return out


def _row_series(run: Run, value: Callable[[RoundRow], float | None]) -> list[Point]:
    points = []
    for row in run.rows:
        y = value(row)
        if y is not None:
            points.append((float(row.round), y))
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
            mean, std = mean_std(values)
            out.append((x, mean, std, len(values)))
    return out


def last_client_accuracies(run: Run) -> tuple[int, list[float]] | None:
    """Per-client test-accuracy in the latest round any client reported one (one per client)."""
    by_round: dict[int, dict[str, float]] = {}
    for row in run.clients:
        acc = as_number(row.metrics.get("test-accuracy"))
        if acc is not None:
            by_round.setdefault(row.round, {})[str(row.client_id)] = acc
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
def _figure(width: float = 7.0, height: float = 4.3, panels: int = 1) -> Iterator[tuple[Any, Any]]:
    """A figure and its axes: one, or a list of `panels` side by side sharing the y axis."""
    import matplotlib  # lazy: matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: matplotlib

    # text stays text in SVG and TrueType in PDF (journals refuse Type 3 fonts)
    style: dict[Any, Any] = {"svg.fonttype": "none", "pdf.fonttype": 42, "ps.fonttype": 42}
    with plt.rc_context(style):
        fig, ax = plt.subplots(1, panels, figsize=(width, height), sharey=True)
        try:
            yield fig, (list(ax) if panels > 1 else ax)
        finally:
            plt.close(fig)


def _save(fig: Any, out: Path, name: str, formats: Sequence[str]) -> None:
    fig.tight_layout()
    for fmt in formats:
        fig.savefig(out / f"{name}.{fmt}", dpi=150)


FINAL_LABEL = "final evaluation (clients)"


def _legend(ax: Any, entries: int, source: Any = None) -> None:
    """The legend of `source`'s lines (default: `ax`'s), the final evaluation's star last;
    beside the plot when it is long."""
    handles, labels = (source or ax).get_legend_handles_labels()
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
    against_time: bool = False,
) -> bool:
    """One figure of every series ending in `suffix`: a colour per series for one group, a
    colour per group for several; a style per series (the server's hollow squares on a dashed
    line); a band of ± std for a group of seeds; the clients' final evaluation marked by a
    star. `against_time`: a second panel beside it draws the same against time. False,
    writing nothing, without data."""
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
    panels = 2 if against_time else 1
    width = (7.0 if single else 9.5) + 5.0 * (panels - 1)
    with _figure(width, 4.3, panels) as (fig, axes):
        axes = axes if against_time else [axes]
        entries, final_marked = _draw_series(axes[0], per_group, metrics, suffix, None)
        axes[0].set_title(_title(title, setting))
        axes[0].set_xlabel("round (the model after that round's aggregation; 0: the initial model)")
        axes[0].set_ylabel(title)
        _integer_ticks(axes[0])
        if against_time:
            times = [[run.round_times() for run in group.runs] for group in groups]
            _draw_series(axes[1], per_group, metrics, suffix, times)
            axes[1].set_title(_title(f"{title} against time", ""))
            axes[1].set_xlabel(time_label([run for group in groups for run in group.runs]))
        for ax in axes:
            ax.grid(True, alpha=0.3)
        if single:  # the legend once, of the first panel's lines; a long one beside the last
            _legend(axes[-1] if entries > 6 else axes[0], entries, axes[0])
        else:
            _two_legends(axes[-1], groups, metrics, final_marked)
        _save(fig, out, name, formats)
    return True


def time_label(runs: Sequence[Run]) -> str:
    """The time axis' label: `virtual seconds` or `seconds`, as the runs' clock is."""
    clocks = {run.clock for run in runs if run.rows}
    if clocks == {CLOCK_VIRTUAL}:
        return "virtual seconds"
    if clocks == {CLOCK_VIRTUAL, CLOCK_WALL}:
        return "seconds (virtual for some runs, wall for others: report.md)"
    return "seconds"


def _at(x: float, times: Sequence[Mapping[int, float]] | None) -> float | None:
    """A round's place on the panel: the round itself, or the mean of the runs' times at its
    end (None when no run has one)."""
    if times is None:
        return x
    found = [t[int(x)] for t in times if int(x) in t]
    return statistics.fmean(found) if found else None


def _draw_series(
    ax: Any,
    per_group: Sequence[tuple[Group, list[dict[str, list[Point]]]]],
    metrics: Sequence[str],
    suffix: str,
    times: Sequence[Sequence[Mapping[int, float]]] | None,
) -> tuple[int, bool]:
    """Every group's series on `ax`, x the round or, given each group's runs' `round_times`,
    the time the round ended (the mean over a group's runs); a group's band is over rounds.
    Returns the legend entries drawn and whether a final evaluation's star was."""
    single = len(per_group) == 1
    entries = 0
    final_marked = False
    colours = _single_colours(metrics)
    for gi, (group, runs) in enumerate(per_group):
        group_times = None if times is None else times[gi]
        for metric in metrics:
            tracks = [series[metric] for series in runs if series.get(metric)]
            if not tracks:
                continue
            style, text = _series_style(metric)
            colour = colours[metric] if single else f"C{gi % 10}"
            # labelled on the rounds panel only; several groups: two legends beside the plot
            label: str | None = text if single and times is None else None
            if label is not None and group.banded:
                label += f"; mean ± std over {group.over}"
            rows = [(at, m, sd) for x, m, sd, _ in band(tracks)
                    if (at := _at(x, group_times)) is not None]  # fmt: skip
            xs = [r[0] for r in rows]
            ax.plot(xs, [r[1] for r in rows], color=colour, label=label, **style)
            entries += 1
            if group.banded:
                lo = [m - sd for _, m, sd in rows]
                hi = [m + sd for _, m, sd in rows]
                ax.fill_between(xs, lo, hi, color=colour, alpha=BAND_ALPHA, linewidth=0)
            finals = [final_points(run, suffix).get(metric) for run in group.runs]
            found = [p for p in finals if p is not None]
            fx = _at(found[0][0], group_times) if found else None
            if fx is not None:
                fy = statistics.fmean(p[1] for p in found)
                ax.plot(
                    [fx], [fy], linestyle="none", marker="*", markersize=13, color=colour,
                    markeredgecolor="black", markeredgewidth=0.6, zorder=4,
                    label=None if final_marked or label is None else FINAL_LABEL,
                )  # fmt: skip
                entries += 0 if final_marked else 1
                final_marked = True
    return entries, final_marked


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
    value: Callable[[RoundRow], float | None],
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


def _row_seconds(row: RoundRow) -> float:
    return row.seconds


def write_plots(runs: Sequence[Run], out: Path, formats: Sequence[str] = ("png",)) -> list[str]:
    """Write every plot some run has data for, in each format; returns the plots' names
    (without suffix)."""
    groups = group_runs(runs)
    setting = setting_text(runs)
    written = []
    for name, suffix, title in (
        (ACCURACY, "accuracy", "test accuracy"),  # beside it: against time
        (LOSS, "loss", "loss"),
        (ENERGY, "energy", "energy captured"),
        (ERROR_RATIO, "error-ratio", "reconstruction error / true model's"),
        (SIGMA, "sigma-mean", "mean sigma"),
        (EPSILON, "epsilon", "privacy spent (epsilon)"),
    ):
        if _plot_metric(out, name, title, suffix, groups, formats, setting, name == ACCURACY):
            written.append(name)
    if _plot_rows(out, TIME, "time per round", "seconds", groups, _row_seconds, formats, setting):
        written.append(TIME)
    if _plot_rows(out, BYTES, "traffic per round (sent + received)", "MB", groups, row_mb,
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
