"""The runs a report is made of: each results directory read into a Run, defensively (a run
that failed early, or is still running, may lack any of its files), and how runs relate: which
repeat one setting over seeds (Group), what they share and the settings in which they differ.
pollen.core.rundir owns the files' format and their typed records (RoundRow, ClientRow,
Summary), which this module reads for `pollen report` (pollen.tools.report), its plots
(pollen.tools.plots) and flat files (pollen.tools.tables); config.json stays a mapping, the
settings of a run of any version.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pollen.core import runconfig
from pollen.core.rundir import (
    CLIENTS,
    CONFIG,
    METRICS,
    SUMMARY,
    ClientRow,
    FinalRecord,
    Metrics,
    ResultsFileError,
    RoundRow,
    Summary,
    read_object,
    read_rows,
)

RESULT_FILES = (CONFIG, METRICS, CLIENTS, SUMMARY)
CLOCK_VIRTUAL, CLOCK_WALL = "virtual", "wall"
"""The clocks of a round row's `time` (docs/pacing.md)."""

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


@dataclass
class Run:
    """Everything the report needs from one results directory: its settings (config.json, a
    mapping: a run of any version), its rounds, client replies and summary (None without
    summary.json)."""

    path: Path
    name: str
    config: dict[str, Any] = field(default_factory=dict)
    rows: list[RoundRow] = field(default_factory=list)
    clients: list[ClientRow] = field(default_factory=list)
    summary: Summary | None = None
    missing: list[str] = field(default_factory=list)

    @property
    def algorithm(self) -> str:
        named = self.summary.algorithm if self.summary else ""
        return str(named or self.config.get("algorithm") or "unknown")

    @property
    def dataset(self) -> str:
        named = self.summary.dataset if self.summary else ""
        return str(named or self.config.get("dataset") or "unknown")

    @property
    def seed(self) -> int | None:
        return as_int(self.config.get("seed"))

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
        return (self.summary.status if self.summary else "") or "unknown"

    @property
    def final(self) -> FinalRecord | None:
        """The evaluation after the last round, when the summary has one."""
        return self.summary.final if self.summary else None

    @property
    def final_eval(self) -> Metrics:
        """The clients' final evaluation (none: empty)."""
        return self.final.eval if self.final else {}

    @property
    def final_server_eval(self) -> Metrics:
        """The server's final evaluation (none: empty)."""
        return (self.final.server_eval if self.final else None) or {}

    @property
    def planned_rounds(self) -> int | None:
        planned = self.summary.rounds if self.summary else None
        return planned or as_int(self.config.get("num-rounds"))

    @property
    def last_round(self) -> int | None:
        return max(row.round for row in self.rows) if self.rows else None

    def total_seconds(self) -> float | None:
        if self.summary is not None:
            return self.summary.seconds
        return sum(row.seconds for row in self.rows) if self.rows else None

    @property
    def times_recorded(self) -> bool:
        """Whether every round's row has its `time` (rows of earlier versions have none)."""
        return bool(self.rows) and all(row.time is not None for row in self.rows)

    @property
    def clock(self) -> str:
        """The clock of the rows' `time`: `virtual` (the simulated devices' time, under the
        settings heterogeneity.clock=virtual with a device profile: docs/pacing.md) or `wall`;
        a run without `time` counts its rounds' wall seconds (`round_times`)."""
        profile = self.config.get("heterogeneity.profile", "none")
        virtual = self.config.get("heterogeneity.clock") == "virtual" and profile != "none"
        return CLOCK_VIRTUAL if virtual and self.times_recorded else CLOCK_WALL

    @property
    def clock_text(self) -> str:
        """The clock `round_times` counts on, in words (empty without rounds)."""
        if not self.rows:
            return ""
        if not self.times_recorded:
            return "wall (no time recorded: the running sum of the rounds' seconds)"
        return self.clock

    def round_times(self) -> dict[int, float]:
        """Seconds since the run started when each round ended, by round (0: the start): the
        rows' `time`, or, for a run that recorded none, the running sum of the rows' `seconds`
        (the rounds' wall time alone: what ran before and between rounds is left out)."""
        out = {0: 0.0}
        recorded, total = self.times_recorded, 0.0
        for row in sorted(self.rows, key=lambda r: r.round):
            total += row.seconds
            out[row.round] = row.time if recorded and row.time is not None else round(total, 4)
        return out

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
        run.summary = Summary.from_json(_read_json(path / SUMMARY))
    if METRICS in present:
        run.rows = [RoundRow.from_json(r) for r in _read_jsonl(path / METRICS)]
    if CLIENTS in present:
        run.clients = [ClientRow.from_json(r) for r in _read_jsonl(path / CLIENTS)]
    return run


def _dir_name(path: Path) -> str:
    return path.resolve().name or str(path)


def unique_names(paths: Sequence[Path]) -> list[str]:
    """Directory names, widened with parents where two runs would otherwise share a label."""
    base = [_dir_name(p) for p in paths]
    names = [
        "/".join(p.resolve().parts[-2:]) if base.count(n) > 1 else n
        for p, n in zip(paths, base, strict=True)
    ]
    return [n if names.count(n) == 1 else f"{n} #{i + 1}" for i, n in enumerate(names)]


# ---- values --------------------------------------------------------------------------------
def as_number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def as_int(value: Any) -> int | None:
    number = as_number(value)
    return int(number) if number is not None and number.is_integer() else None


def sections(row: RoundRow) -> tuple[tuple[Metrics, str], ...]:
    """A round's metrics and whose they are: the clients' aggregate, the server's evaluation
    (empty without server-eval)."""
    return (row.train, "clients"), (row.server_eval or {}, "server")


def row_mb(row: RoundRow) -> float:
    return (row.bytes_sent + row.bytes_received) / 1e6


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


# ---- time to accuracy ----------------------------------------------------------------------
TARGET_FRACTIONS = (0.5, 0.75, 0.9)
"""The default accuracies of `pollen report`'s time to accuracy: these fractions of the best
final accuracy among the compared runs."""


@dataclass(frozen=True)
class Reached:
    """When one run's accuracy first reached one target: the round whose model reached it and
    that round's time (`Run.round_times`); both None when it never did."""

    run: Run
    metric: str  # the series: "clients test-accuracy", "server test-accuracy"
    accuracy: float
    round: int | None
    time: float | None


def default_targets(finals: Sequence[float]) -> list[float]:
    """TARGET_FRACTIONS of the best of `finals` (each run's last accuracy), to 4 decimals as
    the report writes them; none without a positive accuracy."""
    best = max(finals, default=0.0)
    return sorted({round(f * best, 4) for f in TARGET_FRACTIONS}) if best > 0 else []


def first_reached(
    run: Run, metric: str, points: Sequence[tuple[float, float]], accuracy: float
) -> Reached:
    """The first of `points` (x: the round whose model a value describes) at or above
    `accuracy`, with that round's time."""
    times = run.round_times()
    for x, y in sorted(points):
        if y >= accuracy:
            return Reached(run, metric, accuracy, int(x), times.get(int(x)))
    return Reached(run, metric, accuracy, None, None)


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
        lambda r: f"{n} clients" if (n := as_int(r.config.get("num-clients"))) else None,
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

