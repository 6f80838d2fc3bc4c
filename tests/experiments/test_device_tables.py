"""The derivation of the 'phones' profile's tables from their sources' files
(experiments/device_tables.py), on small stand-in files of the sources' formats."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from experiments import device_tables
from experiments.device_tables import cpu_scores, percentiles


def test_percentiles_are_the_hundredths_rounded_to_four_digits() -> None:
    assert percentiles(range(1, 102)) == tuple(float(k) for k in range(1, 102))
    table = percentiles([1.0, 3.0])
    assert table[0] == 1.0 and table[50] == 2.0 and table[100] == 3.0
    assert percentiles([123456.7])[0] == 123500.0
    with pytest.raises(ValueError, match="positive"):
        percentiles([1.0, 0.0])
    with pytest.raises(ValueError, match="at least one"):
        percentiles([])


def test_a_score_is_the_first_number_of_its_field(tmp_path: Path) -> None:
    path = tmp_path / "ranking.json"
    path.write_text(json.dumps([{"CPU_F_AI_Score": "3744"}, {"CPU_F_AI_Score": " 1,250 1,6"}]))
    assert cpu_scores(path) == [3744.0, 1250.0]


def _sources(tmp: Path, bandwidth: float) -> tuple[Path, Path]:
    ranking = tmp / "ranking.json"
    ranking.write_text(json.dumps([{"CPU_F_AI_Score": str(s)} for s in (100, 200, 400)]))
    folder = tmp / "data"
    folder.mkdir()
    for name in ("wifi4.csv", "wifi5.csv", "wifi6.csv", "4G.csv", "5G.csv"):
        (folder / name).write_text(f"brand,bandwidth_Mbps\nx,{bandwidth}\nx,{2 * bandwidth}\n")
    return ranking, folder


def test_check_names_the_first_table_that_differs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    ranking, folder = _sources(tmp_path, 10.0)
    derived = device_tables.tables(ranking, folder)
    assert derived["BANDWIDTH_MBPS['wifi']"][50] == 15.0  # the three WiFi files pooled
    assert derived["PHONE_CPU_SCORES"][50] == 200.0
    monkeypatch.setattr(device_tables, "committed", lambda: dict(derived))
    args = ["check", "--ai-benchmark", str(ranking), "--bandwidth", str(folder)]
    assert device_tables.main(args) == 0
    changed = dict(derived, **{"BANDWIDTH_MBPS['4g']": (1.0,) * 101})
    monkeypatch.setattr(device_tables, "committed", lambda: changed)
    assert device_tables.main(args) == 1
    assert "BANDWIDTH_MBPS['4g']" in capsys.readouterr().out


def test_the_committed_tables_are_well_formed() -> None:
    # what experiments.device_tables check compares against: 101 increasing positive values
    for table in device_tables.committed().values():
        assert len(table) == 101 and table[0] > 0
        assert all(a <= b for a, b in itertools.pairwise(table))


def test_a_missing_source_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["print", "--ai-benchmark", str(tmp_path / "no.json"), "--bandwidth", str(tmp_path)]
    assert device_tables.main(args) == 2
    out = capsys.readouterr().out
    assert "cannot read the sources" in out and out.count("\n") == 1
