"""The client-level DP experiment's bookkeeping: the grid, each run's settings (resolvable as a
run's), and how a cell takes its seeds and its epsilon from the runs' summaries."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from experiments.client_dp import LEVELS, Case, cases, markdown, summarise
from pollen.core.runconfig import resolve


def test_the_grid_has_dp_sgd_for_fedavg_only_and_a_clean_run_per_seed() -> None:
    grid = cases(["fedavg", "fedem"], ["client", "adaptive", "example"], [0, 1])
    levels = ("client", "adaptive", "example")
    per_seed = {"fedavg": 1 + sum(len(LEVELS[k]) for k in levels),
                "fedem": 1 + len(LEVELS["client"]) + len(LEVELS["adaptive"])}  # fmt: skip
    assert len(grid) == 2 * sum(per_seed.values())
    assert not [c for c in grid if c.algorithm == "fedem" and c.level == "example"]
    assert len({c.name for c in grid}) == len(grid)


@pytest.mark.parametrize("level", ["none", "client", "adaptive", "example"])
def test_every_case_is_a_valid_run(tmp_path: Path, level: str) -> None:
    cfg = resolve(Case("fedem" if level != "example" else "fedavg", level, 2.0, 1).settings(
        tmp_path, tmp_path
    ))  # fmt: skip
    assert cfg["num-clients"] == 100 and cfg["fraction-train"] == 0.5
    assert (cfg["client-dp.noise-multiplier"] == 2.0) == (level in ("client", "adaptive"))
    assert (cfg["client-dp.target-quantile"] == 0.5) == (level == "adaptive")
    assert (cfg["dp.noise-multiplier"] == 2.0) == (level == "example")


def test_a_cell_averages_its_seeds_and_reads_the_epsilon_of_its_guarantee(tmp_path: Path) -> None:
    def row(case: Case, acc: float | None, status: str = "completed") -> dict[str, Any]:
        summary = {"privacy": {"client-level": {"epsilon": 6.5}, "example-level": {"epsilon": 2.0}}}
        run = tmp_path / "runs" / case.name
        run.mkdir(parents=True)
        (run / "summary.json").write_text(json.dumps(summary))
        return {"case": case.__dict__, "name": case.name, "accuracy": acc, "status": status}

    rows = [
        row(Case("fedavg", "client", 2.0, 0), 0.5),
        row(Case("fedavg", "client", 2.0, 1), 0.7),
        row(Case("fedavg", "example", 1.0, 0), 0.6),
        row(Case("fedavg", "none", 0.0, 0), None, "failed"),
    ]
    table = summarise(tmp_path, rows)
    cell = table["fedavg/client/2"]
    assert cell["mean"] == 0.6 and cell["std"] == 0.1 and cell["seeds"] == 2
    assert cell["epsilon"] == 6.5 and table["fedavg/example/1"]["epsilon"] == 2.0
    assert table["fedavg/none/0"]["mean"] == 0.0 and table["fedavg/none/0"]["epsilon"] is None
    text = markdown(table)
    assert "| fedavg | client-level | 2 | 6.50 | 0.600 ± 0.100 | 2 |" in text


@pytest.mark.parametrize("level", ["distributed", "local"])
def test_noise_on_the_clients_is_calibrated_to_the_server_noise_s_epsilons(
    tmp_path: Path, level: str
) -> None:
    case = Case("fedavg", level, 16.6, 0)
    assert case.name == f"fedavg-{level}-e16.6-s0"
    cfg = resolve(case.settings(tmp_path, tmp_path))
    assert cfg["client-dp.target-epsilon"] == 16.6 and cfg["client-dp.noise-at"] == "client"
    assert cfg["secagg.enabled"] == (level == "distributed")
    assert LEVELS[level] == (51.0, 16.6, 6.23)


def test_noise_shared_out_at_the_server_noise_s_multiplier_is_a_secure_run(tmp_path: Path) -> None:
    case = Case("fedavg", "distributed-z", 2.0, 0)
    cfg = resolve(case.settings(tmp_path, tmp_path))
    assert cfg["client-dp.noise-multiplier"] == 2.0 and cfg["client-dp.noise-at"] == "client"
    assert cfg["secagg.enabled"] is True and cfg["client-dp.target-epsilon"] == 0
    assert "| fedavg | client-level, distributed | 2 |" in markdown(
        {"fedavg/distributed-z/2": {"mean": 0.4, "std": 0.0, "seeds": 1, "epsilon": 10.5}}
    )


def test_fedbuff_is_the_server_noise_at_its_epsilons_with_versions_of_fifty(
    tmp_path: Path,
) -> None:
    case = Case("fedavg", "fedbuff", 6.23, 0)
    assert case.name == "fedavg-fedbuff-e6.23-s0"
    cfg = resolve(case.settings(tmp_path, tmp_path))
    assert cfg["client-dp.target-epsilon"] == 6.23 and cfg["client-dp.noise-at"] == "server"
    assert cfg["async.buffer"] == cfg["async.concurrency"] == 50
    assert LEVELS["fedbuff"] == (0.0, *LEVELS["distributed"])
    reference = resolve(Case("fedavg", "fedbuff", 0.0, 0).settings(tmp_path, tmp_path))
    assert reference["async.buffer"] == 50 and reference["client-dp.target-epsilon"] == 0
