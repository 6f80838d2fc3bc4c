"""`pollen experiment`: a paper experiment file run, methods x seeds, then tabulated
(pollen.tools.experiment runs it)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path


def cmd_experiment(args: argparse.Namespace) -> int:
    from pollen.tools.experiment import Experiment, run, tabulate  # lazy: only on this path

    exp = Experiment.load(Path(args.file))
    if args.seeds:
        try:
            seeds = tuple(int(s) for s in args.seeds.split(","))
        except ValueError:
            print(
                f"pollen: error: --seeds takes integers like 0,1,2, not {args.seeds!r}",
                file=sys.stderr,
            )
            return 2
        exp = dataclasses.replace(exp, seeds=seeds)
    if args.methods:
        chosen = [m.strip() for m in args.methods.split(",") if m.strip()]
        unknown = [m for m in chosen if m not in exp.methods]
        if unknown or not chosen:
            print(
                f"pollen: error: --methods: {', '.join(unknown) or 'none given'}; "
                f"{exp.name} has {', '.join(exp.methods)}",
                file=sys.stderr,
            )
            return 2
        exp = dataclasses.replace(exp, methods={m: exp.methods[m] for m in chosen})
    out = Path(args.out) if args.out else Path("results") / exp.name
    if args.table_only and not out.is_dir():
        print(f"pollen: error: --table-only: {out} holds no runs", file=sys.stderr)
        return 2
    runtime: list[str] = []
    if args.gpus_per_client is not None:
        runtime += ["--gpus-per-client", repr(args.gpus_per_client)]
    if args.parallel is not None:
        runtime += ["--parallel", str(args.parallel)]
    if runtime and exp.mode != "simulate":
        print(
            f"pollen: error: --gpus-per-client and --parallel are options of simulation; "
            f"{exp.name} runs in {exp.mode} mode",
            file=sys.stderr,
        )
        return 2
    table = tabulate(exp, out) if args.table_only else run(exp, out, runtime)
    print((out / "results.md").read_text())
    return 0 if table["methods"] else 1
