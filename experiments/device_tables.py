"""The measured tables behind `heterogeneity.profile = phones` (pollen/core/device_data.py,
docs/pacing.md#devices), derived again from their published sources:

- the phones' compute: AI Benchmark's CPU floating-point scores of 333 Android phone models
  (Ignatov et al., "AI Benchmark: All About Deep Learning on Smartphones in 2019", ICCV
  Workshops 2019), in the copy of its ranking that FLASH's repository keeps
  (github.com/PKU-Chengxu/FLASH, `models/utils/device_util/raw_ai_benchmark_list.json`; Yang et
  al., "Characterizing Impacts of Heterogeneity in Federated Learning upon Large-Scale
  Smartphone Data", WWW 2021);
- the links: the 50,000 bandwidth tests the authors of "Mobile Access Bandwidth in Practice:
  Measurement, Analysis, and Implications" (Yang et al., SIGCOMM 2022) released, 10,000 each
  over WiFi 4, 5, 6, 4G and 5G (github.com/mobilebandwidth/mobilebandwidth.github.io, `data/*.csv`,
  column `bandwidth_Mbps`; Apache-2.0).

Each table is the percentiles 0, 1, ..., 100 of its values (linear interpolation between order
statistics, NumPy's default), rounded to four significant digits.

    python -m experiments.device_tables print --ai-benchmark FILE --bandwidth DIR
    python -m experiments.device_tables check --ai-benchmark FILE --bandwidth DIR

`print` writes the tables as pollen.core.device_data holds them (its docstrings aside);
`check` compares them with pollen.core.device_data and exits 1 naming the first table that
differs.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

NETWORK_FILES: dict[str, tuple[str, ...]] = {
    "wifi": ("wifi4.csv", "wifi5.csv", "wifi6.csv"),
    "4g": ("4G.csv",),
    "5g": ("5G.csv",),
}
"""Each network's files of the bandwidth release ('wifi': the three WiFi standards' tests
pooled, 10,000 of each as released)."""


def percentiles(values: Iterable[float]) -> tuple[float, ...]:
    """The percentiles 0, 1, ..., 100 of `values`, each rounded to four significant digits."""
    array = np.asarray(list(values), dtype=float)
    if array.size == 0 or not np.all(np.isfinite(array)) or np.any(array <= 0):
        raise ValueError("the values must be positive finite numbers, and at least one")
    return tuple(_significant(float(v)) for v in np.percentile(array, np.arange(101)))


def _significant(value: float, digits: int = 4) -> float:
    return round(value, digits - 1 - math.floor(math.log10(abs(value))))


def cpu_scores(path: Path) -> list[float]:
    """Every phone model's `CPU_F_AI_Score` (its first number) in AI Benchmark's ranking."""
    models = json.loads(path.read_text(encoding="utf-8"))
    return [float(str(m["CPU_F_AI_Score"]).split()[0].replace(",", "")) for m in models]


def bandwidths(folder: Path, network: str) -> list[float]:
    """Every test's `bandwidth_Mbps` in the network's files."""
    out: list[float] = []
    for name in NETWORK_FILES[network]:
        with (folder / name).open(encoding="utf-8", newline="") as f:
            out.extend(float(row["bandwidth_Mbps"]) for row in csv.DictReader(f))
    return out


def tables(ai_benchmark: Path, bandwidth: Path) -> dict[str, tuple[float, ...]]:
    """Every table by the name pollen.core.device_data gives it."""
    out = {"PHONE_CPU_SCORES": percentiles(cpu_scores(ai_benchmark))}
    for network in NETWORK_FILES:
        out[f"BANDWIDTH_MBPS[{network!r}]"] = percentiles(bandwidths(bandwidth, network))
    return out


def committed() -> dict[str, tuple[float, ...]]:
    from pollen.core import device_data

    out = {"PHONE_CPU_SCORES": tuple(device_data.PHONE_CPU_SCORES)}
    for network, table in device_data.BANDWIDTH_MBPS.items():
        out[f"BANDWIDTH_MBPS[{network!r}]"] = tuple(table)
    return out


def differences(
    derived: dict[str, tuple[float, ...]], kept: dict[str, tuple[float, ...]]
) -> list[str]:
    """The names of the tables that differ (or that one side lacks)."""
    names = sorted(set(derived) | set(kept))
    return [name for name in names if derived.get(name) != kept.get(name)]


def _rows(table: Sequence[float], indent: str) -> str:
    rows = [", ".join(f"{v:g}" for v in table[i : i + 10]) for i in range(0, len(table), 10)]
    return "".join(f"{indent}{row},\n" for row in rows)


def render(derived: dict[str, tuple[float, ...]]) -> str:
    """The tables as pollen.core.device_data writes them (its docstrings aside)."""
    text = "PHONE_CPU_SCORES: tuple[float, ...] = (\n"
    text += _rows(derived["PHONE_CPU_SCORES"], "    ") + ")\n"
    text += "BANDWIDTH_MBPS: dict[str, tuple[float, ...]] = {\n"
    for network in NETWORK_FILES:
        table = derived[f"BANDWIDTH_MBPS[{network!r}]"]
        text += f'    "{network}": (\n' + _rows(table, "        ") + "    ),\n"
    return text + "}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="the measured tables of the 'phones' profile")
    p.add_argument("command", choices=("print", "check"))
    p.add_argument(
        "--ai-benchmark",
        type=Path,
        required=True,
        help="FLASH's models/utils/device_util/raw_ai_benchmark_list.json",
    )
    p.add_argument(
        "--bandwidth",
        type=Path,
        required=True,
        help="the bandwidth release's data/ folder (4G.csv, 5G.csv, wifi4.csv ... wifi6.csv)",
    )
    args = p.parse_args(argv)
    try:
        derived = tables(args.ai_benchmark, args.bandwidth)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"device_tables: cannot read the sources: {exc.__class__.__name__}: {exc}")
        return 2
    if args.command == "print":
        print(render(derived))
        return 0
    different = differences(derived, committed())
    if different:
        print(f"device_tables: pollen.core.device_data differs from its sources in {different[0]}")
        return 1
    print(f"device_tables: all {len(derived)} tables match their sources")
    return 0


if __name__ == "__main__":
    sys.exit(main())
