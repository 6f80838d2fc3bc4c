"""The flat files of `pollen report`, for pandas: metrics.csv (a row per run and round, and
the final evaluation), clients.csv (a row per client reply) and time-to-accuracy.csv (a row per
run and accuracy). Columns: docs/monitoring.md#reports.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pollen.tools.runs import Reached, Run, as_number, sections

METRICS_CSV = "metrics.csv"
CLIENTS_CSV = "clients.csv"
TIME_TO_ACCURACY_CSV = "time-to-accuracy.csv"
RUN_COLUMNS = ("run", "algorithm", "dataset", "seed")
ROUND_COLUMNS_CSV = ("round", "stage", "seconds", "time", "bytes-sent", "bytes-received")


def _run_cells(run: Run) -> dict[str, Any]:
    return {"run": run.name, "algorithm": run.algorithm, "dataset": run.dataset, "seed": run.seed}


def metrics_table(runs: Sequence[Run]) -> tuple[list[str], list[dict[str, Any]]]:
    """metrics.csv: a row per run and round (stage `round`) and one for the final evaluation
    (stage `final`, at the last round), metrics as `clients.KEY` and `server.KEY`."""
    rows: list[dict[str, Any]] = []
    for run in runs:
        for row in run.rows:
            cells = {
                **_run_cells(run), "round": row.round, "stage": "round", "seconds": row.seconds,
                "time": row.time, "bytes-sent": row.bytes_sent,
                "bytes-received": row.bytes_received,
            }  # fmt: skip
            for section, who in sections(row):
                for key, value in section.items():
                    if as_number(value) is not None:
                        cells[f"{who}.{key}"] = value
            rows.append(cells)
        finals = ((run.final_eval, "clients"), (run.final_server_eval, "server"))
        if any(section for section, _ in finals):
            cells = {**_run_cells(run), "round": run.last_round, "stage": "final"}
            for section, who in finals:
                for key, value in section.items():
                    if as_number(value) is not None:
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
            final = run.is_final(row.round)
            cells = {
                **_run_cells(run),
                "round": run.planned_rounds if final else row.round,
                "stage": "final" if final else "round",
                "client-id": row.client_id,
                "phase": row.phase,
            }
            for key, value in row.metrics.items():
                if as_number(value) is not None:
                    cells[str(key)] = value
            rows.append(cells)
    head = [*RUN_COLUMNS, "round", "stage", "client-id", "phase"]
    return head + sorted({k for r in rows for k in r} - set(head)), rows


def time_to_accuracy_table(reached: Sequence[Reached]) -> tuple[list[str], list[dict[str, Any]]]:
    """time-to-accuracy.csv: a row per run and accuracy (pollen.tools.report.time_to_accuracy):
    the series read, whether and in which round it was reached, that round's time, its clock
    and whether the run recorded it (else: the running sum of its rounds' seconds)."""
    rows = [
        {
            **_run_cells(r.run), "metric": r.metric, "accuracy": r.accuracy,
            "reached": r.round is not None, "round": r.round, "time": r.time,
            "clock": r.run.clock, "time-recorded": r.run.times_recorded,
        }
        for r in reached
    ]  # fmt: skip
    columns = [*RUN_COLUMNS, "metric", "accuracy", "reached", "round", "time", "clock",
               "time-recorded"]  # fmt: skip
    return columns, rows


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


def write_tables(runs: Sequence[Run], out: Path, reached: Sequence[Reached] = ()) -> list[str]:
    """metrics.csv, clients.csv and, of `reached`, time-to-accuracy.csv (each only when it has
    a row); returns the names written."""
    tables = (
        (METRICS_CSV, metrics_table(runs)),
        (CLIENTS_CSV, clients_table(runs)),
        (TIME_TO_ACCURACY_CSV, time_to_accuracy_table(reached)),
    )
    return [name for name, table in tables if _write_csv(out / name, table)]
