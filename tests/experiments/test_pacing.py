"""The pacing experiment's grid (experiments/pacing.py): each case's settings."""

from __future__ import annotations

from pathlib import Path

from experiments.pacing import DEADLINE, Case, cases
from pollen.core.pacing import devices
from pollen.core.runconfig import resolve


def test_the_phones_profile_changes_the_devices_only(tmp_path: Path) -> None:
    tiers, phones = (Case("fedavg", "deadline", 100, 0, p) for p in ("tiers", "phones"))
    assert tiers.name == "fedavg-deadline-n100-s0"  # the published runs' names
    assert phones.name == "fedavg-deadline-n100-s0-phones"
    a, b = tiers.settings(tmp_path, tmp_path), phones.settings(tmp_path, tmp_path)
    assert b.pop("heterogeneity.profile") == "phones" and a.pop("heterogeneity.profile") == "tiers"
    differ = {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)}
    assert differ == {"out-dir", "run-name"}
    assert b["round.deadline"] == DEADLINE["fedavg"]
    fleet = devices(resolve(phones.settings(tmp_path, tmp_path)), 100, seed=0)
    assert len({d.bandwidth_mbps for d in fleet}) == 100  # measured links, one per client


def test_cases_carry_the_profile() -> None:
    grid = cases(["fedavg"], ["sync", "fedbuff"], [100], [0, 1], "phones")
    assert len(grid) == 4 and {c.profile for c in grid} == {"phones"}
