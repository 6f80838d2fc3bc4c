"""Command-line output that needs no federation: `pollen data summary`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from pollen.core.settings import SettingsError
from pollen.tools import cli
from pollen.tools.cli import resolve
from pollen.tools.cli.parser import build_parser
from pollen.tools.cli.resolve import Watch


def test_data_summary_prints_and_plots_each_clients_label_counts(
    tmp_path: Path, shared_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    split = ["--set", "dataset=digits", "--set", "num-clients=3", "--set",
             "partitioner=dirichlet", "--set", "dirichlet-alpha=0.3",
             "--set", f"cache-dir={shared_cache}"]  # fmt: skip
    assert cli.main(["data", "summary", *split, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    plot = tmp_path / "partition.svg"
    assert cli.main(["data", "summary", *split, "--plot", str(plot)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["client", "train", "val", "test", "|", "train", "examples",
                                "of", "each", "label"]  # fmt: skip
    assert lines[1].split() == ["|", *(str(i) for i in range(10))]
    for client, line in zip(summary["clients"], lines[2:5], strict=True):
        cells = line.split()
        assert cells[:4] == [str(client[k]) for k in ("client_id", "train", "val", "test")]
        assert cells[5:] == [str(n) for n in client["train_labels"]]  # every count, zeros too
    assert lines[5] == f"label distribution drawn to {plot}"
    text = plot.read_text()
    assert "digits, dirichlet α=0.3, 3 clients, seed 0: train labels per client" in text


def test_data_summary_refuses_a_plot_file_it_cannot_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["data", "summary", "--set", "dataset=digits", "--plot",
                     str(tmp_path / "partition.gif")])  # fmt: skip
    assert code == 2
    assert capsys.readouterr().err == (
        f"pollen: error: --plot {tmp_path / 'partition.gif'}: the file must end in .png, .svg "
        "or .pdf\n"
    )


@pytest.mark.parametrize("command", ["simulate", "deploy", "run --superlink 127.0.0.1:9093"])
def test_every_run_command_takes_plain_and_tensorboard(command: str) -> None:
    parser = build_parser()
    given = parser.parse_args([*command.split(), "--plain", "--tensorboard", "tb"])
    assert Watch.of(given) == Watch(plain=True, tensorboard=Path("tb"))
    # without --plain the view follows the output: live on a terminal, plain lines elsewhere
    assert Watch.of(parser.parse_args(command.split())) == Watch(None, None)


def test_the_data_check_in_a_child_process_answers_as_the_one_in_process(
    run_config: dict[str, Any],
) -> None:
    """resolve.check_data_apart (what a launcher without torch runs) gives the model's bytes
    and, for data that cannot be partitioned so, the same one-line error as check_data."""
    weighed = resolve.check_data(run_config)
    assert weighed > 0
    assert resolve.check_data_apart(run_config) == weighed
    bad = {**run_config, "partitioner": "classes", "classes-per-client": 11}
    with pytest.raises(SettingsError) as here:
        resolve.check_data(bad)
    with pytest.raises(SettingsError) as apart:
        resolve.check_data_apart(bad)
    assert str(apart.value) == str(here.value)
    assert "classes_per_client must be in [1, 10]" in str(apart.value)


@pytest.mark.parametrize(
    ("child", "says"),
    [
        ('echo "Traceback (most recent call last):" >&2; echo "MemoryError" >&2; exit 1',
         "checking the data and the model failed (exit code 1): MemoryError"),
        ("exit 137", "checking the data and the model failed (exit code 137): no output"),
        ('echo \'{"error": "the one line"}\'', "the one line"),
    ],
)  # fmt: skip
def test_a_data_check_child_that_fails_or_dies_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, child: str, says: str
) -> None:
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\ncat > /dev/null\n{child}\n")
    fake.chmod(0o755)
    monkeypatch.setattr(resolve.sys, "executable", str(fake))
    with pytest.raises(SettingsError) as raised:
        resolve.check_data_apart({"dataset": "digits"})
    assert str(raised.value) == says


def test_what_the_data_check_child_warns_is_passed_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\ncat > /dev/null\necho 'UserWarning: a library' >&2\n"
                    "echo '{\"model-bytes\": 12}'\n")  # fmt: skip
    fake.chmod(0o755)
    monkeypatch.setattr(resolve.sys, "executable", str(fake))
    assert resolve.check_data_apart({"dataset": "digits"}) == 12
    assert "UserWarning: a library" in capsys.readouterr().err
