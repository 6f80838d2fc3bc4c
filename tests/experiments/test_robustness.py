"""The robustness experiment's bookkeeping: which runs a grid holds, how a cell's worst case is
taken, and how a rule sized below the attackers is told apart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from experiments.robustness import Case, cases, markdown, summarise


def _row(case: Case, accuracy: float | None, status: str = "completed") -> dict[str, Any]:
    return {"case": case.__dict__, "name": case.name, "accuracy": accuracy, "status": status}


def test_a_grid_runs_every_attack_under_attack_and_none_when_clean() -> None:
    grid = cases(["fedavg"], ["iid"], [0, 2], ["sign-flip", "alie"], ["mean", "median"], [0, 1])
    assert len(grid) == 2 * 2 + 2 * 2 * 2  # clean: rules x seeds; f = 2: x attacks too
    assert {c.attack for c in grid if c.f == 0} == {"none"}
    assert len({c.name for c in grid}) == len(grid)


def test_settings_size_the_rule_and_name_the_attackers(tmp_path: Path) -> None:
    cfg = Case("fedem", "dir0.5", 3, "alie", "multi-krum", 1).settings(tmp_path, tmp_path)
    assert cfg["num-clients"] == 13 and cfg["attack.clients"] == "10-12"
    assert cfg["robust.f"] == 3 and cfg["dirichlet-alpha"] == 0.5
    clean = Case("fedavg", "iid", 0, "none", "median", 0).settings(tmp_path, tmp_path)
    assert clean["robust.f"] == 2 and "attack.clients" not in clean
    small = Case("fedavg", "iid", 3, "alie", "median", 0, size=1)
    assert small.settings(tmp_path, tmp_path)["robust.f"] == 1 and "size1" in small.name
    assert "robust.f" not in Case("fedavg", "iid", 2, "alie", "mean", 0).settings(
        tmp_path, tmp_path
    )


def test_the_worst_case_is_over_attacks_of_seed_means_and_a_failed_run_counts_zero() -> None:
    rows = [
        _row(Case("fedavg", "iid", 2, "alie", "median", 0), 0.8),
        _row(Case("fedavg", "iid", 2, "alie", "median", 1), 0.6),  # alie: mean 0.7
        _row(Case("fedavg", "iid", 2, "ipm", "median", 0), 0.9),
        _row(Case("fedavg", "iid", 2, "ipm", "median", 1), 0.8),  # ipm: mean 0.85
        _row(Case("fedavg", "iid", 2, "ipm", "mean", 0), None, "failed"),
        _row(Case("fedavg", "iid", 0, "none", "mean", 0), 0.9),
        _row(Case("fedavg", "iid", 3, "alie", "median", 0, size=1), 0.5),
    ]
    table = summarise(rows)
    cell = table["fedavg/iid/f2/median"]
    assert cell["worst"] == 0.7 and cell["worst-attack"] == "alie" and cell["seeds"] == 2
    assert table["fedavg/iid/f2/mean"]["worst"] == 0.0
    assert table["fedavg/iid/f3/median sized f=1"]["worst"] == 0.5
    text = markdown(table)
    assert "| median | " in text and "0.700 (alie)" in text and "median sized f=1" in text
