"""`pollen report`: plots, CSV files and a Markdown summary of results directories
(pollen.tools.report writes them)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def cmd_report(args: argparse.Namespace) -> int:
    from pollen.tools.report import parse_formats, write_report  # lazy: only on this path
    from pollen.tools.runs import ReportError  # lazy: only on this path

    try:
        formats = parse_formats(args.format)
        out = write_report(
            [Path(d) for d in args.dirs], Path(args.out) if args.out else None, formats,
            args.accuracy,
        )  # fmt: skip
    except ReportError as exc:
        print(f"pollen: error: {exc}", file=sys.stderr)
        return 2
    print(f"report written to {out}: {', '.join(sorted(p.name for p in out.iterdir()))}")
    return 0
