"""`pollen settings`, `pollen algorithms` and `pollen datasets`: what a run can be given."""

from __future__ import annotations

import argparse

from pollen.core import registry, runconfig


def cmd_settings(args: argparse.Namespace) -> int:
    declared = runconfig.all_settings()
    if args.algorithm:
        runconfig.resolve({"algorithm": args.algorithm})  # an unknown one: named, with a hint
        foreign = runconfig.foreign_settings(args.algorithm, declared)
        declared = {k: v for k, v in declared.items() if k not in foreign}
    for key, s in declared.items():
        extra = f" one of: {', '.join(s.choices)}" if s.choices else ""
        print(f"{key:24s} {s.default!r:>12}  {s.help}{extra}")
    return 0


def cmd_algorithms(args: argparse.Namespace) -> int:
    for name, spec in sorted(registry.ALGORITHMS.items()):
        print(f"{name:12s} {spec.description}")
    return 0


def cmd_datasets(args: argparse.Namespace) -> int:
    from federated_data.catalog import CATALOG  # lazy: heavy data code

    for name, info in CATALOG.items():
        print(f"{name:14s} input {info.input_shape}, {info.num_classes} classes")
    return 0
