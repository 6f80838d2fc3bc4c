"""`pollen data`: a dataset downloaded, and how a run's settings split the data (sizes and label
counts per client, as a table, JSON or a plot)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pollen.core import runconfig
from pollen.core import settings as settings_mod
from pollen.core.dataspec import data_spec
from pollen.core.paths import cache_dir
from pollen.core.settings import RunSettings, Scalar, SettingsError
from pollen.tools import preflight


def cmd_data_download(args: argparse.Namespace) -> int:
    """Fetch a torchvision dataset into a data directory (needs internet)."""
    from federated_data import DataConfigError, load_dataset  # lazy: heavy data code
    from federated_data.registry import dataset_param_names  # lazy: heavy data code

    try:
        if dataset_param_names(args.name):
            print(f"{args.name} is generated on the clients from the run settings; nothing to get")
            return 0
        source = load_dataset(args.name, args.data_dir, download=True)
    except DataConfigError as exc:
        print(f"pollen: error: {exc}", file=sys.stderr)
        return 2
    test = len(source.test) if source.test is not None else 0
    print(f"{args.name}: {len(source.train)} training and {test} test examples in {args.data_dir}")
    return 0


def cmd_data_summary(args: argparse.Namespace) -> int:
    """Show how a run's settings split the data: sizes and label counts per client, and with
    --plot the label distribution as stacked bars."""
    from federated_data import DataConfigError, partition_summary  # lazy: heavy data code

    plot = Path(args.plot) if args.plot else None
    if plot is not None:
        suffix = plot.suffix.lower().lstrip(".")
        if suffix not in ("png", "svg", "pdf"):
            print(
                f"pollen: error: --plot {plot}: the file must end in .png, .svg or .pdf",
                file=sys.stderr,
            )
            return 2
        preflight.check_writable_dir(plot.parent if str(plot.parent) else Path("."), "--plot")
    try:
        resolved = runconfig.resolve(settings_mod.parse_assignments(args.set))
        summary = partition_summary(data_spec(resolved), cache_dir(resolved))
    except (SettingsError, DataConfigError) as exc:
        print(f"pollen: error: {exc}", file=sys.stderr)
        return 2
    print(
        json.dumps(summary, indent=1 if args.json else None)
        if args.json
        else _format_partition(summary)
    )
    if plot is not None:
        from pollen.tools.plots import plot_partition  # lazy: matplotlib, only with --plot

        run = RunSettings.of(resolved)
        plot_partition(summary, plot, _partition_title(resolved, run))
        print(f"label distribution drawn to {plot}", file=sys.stderr if args.json else sys.stdout)
    return 0


def _partition_title(resolved: Mapping[str, Scalar], run: RunSettings) -> str:
    from pollen.tools.runs import partition_text  # lazy: only on this path

    partition = partition_text(resolved) or run.partitioner
    return (
        f"{run.dataset}, {partition}, {run.num_clients} clients, seed {run.seed}: "
        "train labels per client"
    )


LABEL_TABLE_MOST = 20
"""`pollen data summary` shows label counts as columns up to this many labels; beyond, as
label:count pairs of the labels a client holds."""


def _format_partition(summary: dict[str, Any]) -> str:
    """Per client: its split sizes and how many training examples of each label it holds."""
    clients = [c for c in summary.get("clients", []) if isinstance(c, dict)]
    if not clients:
        return json.dumps(summary)
    labels = max(len(c.get("train_labels") or []) for c in clients)
    sizes = ("train", "val", "test")
    widths = {k: max(len(k), *(len(str(c.get(k, ""))) for c in clients)) for k in sizes}
    left = "client  " + "  ".join(f"{k:>{widths[k]}}" for k in sizes)
    columns = 0 < labels <= LABEL_TABLE_MOST
    width = max(3, *(len(str(n)) for c in clients for n in c.get("train_labels") or [0]))
    lines = [left]
    if columns:
        lines = [
            f"{left} | train examples of each label",
            f"{'':{len(left)}} | " + " ".join(f"{i:>{width}}" for i in range(labels)),
        ]
    elif labels:
        lines = [f"{left} | train examples of each label held (label:count)"]
    for client in clients:
        line = f"{client.get('client_id', '?'):>6}  " + "  ".join(
            f"{client.get(k, ''):>{widths[k]}}" for k in sizes
        )
        counts = list(client.get("train_labels") or [])
        if columns:
            counts += [0] * (labels - len(counts))
            line += " | " + " ".join(f"{n:>{width}}" for n in counts)
        elif labels:
            line += " | " + " ".join(f"{i}:{n}" for i, n in enumerate(counts) if n)
        lines.append(line)
    return "\n".join(lines)
