"""`pollen simulate` submits a run again when Ray's runtime did not start (no Ray here: the
federation and the run are faked)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest

from pollen.core.settings import Scalar
from pollen.tools import cli
from pollen.tools.cli import simulate

ROOT = Path(__file__).resolve().parents[2]


class FakeFederation:
    made: ClassVar[list[FakeFederation]] = []

    def __init__(self, workdir: Path) -> None:
        workdir.mkdir(parents=True)
        self.env: dict[str, str] = {"MALLOC_TRIM_THRESHOLD_": "7"}  # as if the user's own
        FakeFederation.made.append(self)

    def start_superlink(self, simulation: bool) -> tuple[int, int]:
        assert simulation
        return 0, 0

    def configure_simulation(
        self,
        num_supernodes: int,
        cpus_per_client: int,
        gpus_per_client: float = 0.0,
        num_gpus: int | None = None,
    ) -> None:
        pass

    def stop(self) -> None:
        pass


def _simulate(
    tmp_path: Path,
    shared_cache: Path,
    monkeypatch: pytest.MonkeyPatch,
    failures: list[str],
    clients: int = 2,
    extra: tuple[str, ...] = (),
) -> tuple[int, list[dict[str, Scalar]], Path]:
    """`pollen simulate` whose runs fail with `failures` in turn (then succeed)."""
    out = tmp_path / "run"
    submitted: list[dict[str, Scalar]] = []
    outcomes = iter(failures)

    def fake_run_and_report(
        fed: Any, resolved: dict[str, Scalar], timeout: float, watch: Any = None
    ) -> int:
        submitted.append(dict(resolved))
        failure = next(outcomes, None)
        (out / "events.jsonl").write_text(json.dumps({"attempt": len(submitted)}) + "\n")
        (out / "server.log").write_text(f"Exception: {failure}\n" if failure else "done\n")
        return 1 if failure else 0

    monkeypatch.setattr(simulate, "LocalFederation", FakeFederation)
    monkeypatch.setattr(simulate, "run_and_report", fake_run_and_report)
    monkeypatch.setattr(simulate.time, "sleep", lambda seconds: None)
    argv = ["simulate", "--dataset", "digits", "--clients", str(clients), "--rounds", "1",
            "--out", str(out), "--set", f"cache-dir={shared_cache}", *extra]  # fmt: skip
    return cli.main(argv), submitted, out


def test_a_runtime_that_did_not_start_is_submitted_again(
    tmp_path: Path,
    shared_cache: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    ray = "RuntimeError: The current node timed out during startup."
    code, submitted, out = _simulate(tmp_path, shared_cache, monkeypatch, [ray, ray])
    assert code == 0 and len(submitted) == 3
    assert all(s == submitted[0] for s in submitted)  # the same run each time
    assert simulate.RUNTIME_START_FAILURE in ray
    for attempt in (1, 2):  # each failed attempt's log kept, its events gone
        assert ray in (out / f"server-attempt{attempt}.log").read_text()
    assert (out / "server.log").read_text() == "done\n"
    assert (out / "events.jsonl").read_text() == '{"attempt": 3}\n'
    assert "the simulation runtime did not start (attempt 2 of 3" in capsys.readouterr().err


def test_other_failures_are_not_retried_and_retries_are_bounded(
    tmp_path: Path, shared_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, submitted, _ = _simulate(tmp_path / "a", shared_cache, monkeypatch, ["ValueError: x"])
    assert code == 1 and len(submitted) == 1
    ray = "timed out during startup"
    code, submitted, out = _simulate(tmp_path / "b", shared_cache, monkeypatch, [ray] * 5)
    assert code == 1 and len(submitted) == simulate.RUNTIME_START_ATTEMPTS == 3
    assert ray in (out / "server.log").read_text()  # the last attempt's log, as it was


def test_the_default_packing_puts_more_clients_on_a_node_the_smaller_the_model() -> None:
    least, most = simulate.CLIENTS_PER_NODE, simulate.MOST_CLIENTS_PER_NODE
    assert simulate.clients_per_node(1) == most
    assert simulate.clients_per_node(simulate.NODE_MODEL_BYTES // 40) == 40
    assert simulate.clients_per_node(simulate.NODE_MODEL_BYTES // 8) == least  # 8 only: too few
    assert simulate.clients_per_node(10 * simulate.NODE_MODEL_BYTES) == least


@pytest.mark.parametrize(
    ("model_mb", "extra", "nodes"),
    [
        (None, (), 8),  # the MLP on digits (60 KB): 64 clients a node, at least 4 x --parallel 2
        (64, (), 19),  # a 64 MB model: 16 clients a node
        (None, ("--parallel", "4"), 16),  # 4 x --parallel
        (64, ("--nodes", "5"), 5),  # given: as given
    ],
)
def test_the_default_packing_follows_the_model_and_parallel(
    tmp_path: Path,
    shared_cache: Path,
    monkeypatch: pytest.MonkeyPatch,
    model_mb: int | None,
    extra: tuple[str, ...],
    nodes: int,
) -> None:
    if model_mb is not None:
        monkeypatch.setattr(simulate, "model_bytes", lambda resolved: model_mb * 2**20)
    code, submitted, _ = _simulate(tmp_path, shared_cache, monkeypatch, [], 300, extra)
    assert code == 0
    assert submitted[0]["simulation-nodes"] == nodes


@pytest.mark.parametrize(
    ("extra", "interval"),
    [((), simulate.SIMULATION_POLL_INTERVAL), (("--set", "poll-interval=2"), 2.0)],
)
def test_simulation_polls_for_replies_often_unless_told(
    tmp_path: Path,
    shared_cache: Path,
    monkeypatch: pytest.MonkeyPatch,
    extra: tuple[str, ...],
    interval: float,
) -> None:
    code, submitted, _ = _simulate(tmp_path, shared_cache, monkeypatch, [], extra=extra)
    assert code == 0
    assert submitted[0]["poll-interval"] == interval


def test_the_launcher_checks_the_data_and_model_without_importing_torch(
    tmp_path: Path, shared_cache: Path
) -> None:
    """A launcher that has not imported torch builds the model and reads the first partition
    in a child process (resolve.check_data_apart): it does not hold torch for the whole run,
    and the packing still follows the model's bytes."""
    probe = (
        "import json, sys\n"
        "from pollen.tools.cli.parser import build_parser\n"
        "from pollen.tools.cli import simulate\n"
        "from pollen.tools.cli.resolve import resolve_run_settings\n"
        "args = build_parser().parse_args(sys.argv[1:])\n"
        "resolved = resolve_run_settings(args)\n"
        "nodes = simulate._simulation_nodes(args, resolved, False)\n"
        "print(json.dumps({'torch': 'torch' in sys.modules, 'nodes': nodes}))\n"
    )
    argv = ["simulate", "--dataset", "digits", "--clients", "300", "--out", str(tmp_path / "r")]
    env = dict(os.environ, POLLEN_CACHE_DIR=str(shared_cache), FLWR_TELEMETRY_ENABLED="0")
    done = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True,
                          cwd=ROOT, env=env, check=False, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"torch": False, "nodes": 8}  # the MLP on digits: 64 clients a node, as above


def test_the_simulation_frees_rays_objects_often_and_keeps_the_users_own_values(
    tmp_path: Path, shared_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, _ = _simulate(tmp_path, shared_cache, monkeypatch, [])
    assert code == 0
    env = FakeFederation.made[-1].env
    assert env["RAY_free_objects_period_milliseconds"] == "100"
    assert env["MALLOC_MMAP_THRESHOLD_"] == simulate.SIMULATION_MALLOC["MALLOC_MMAP_THRESHOLD_"]
    assert env["MALLOC_TRIM_THRESHOLD_"] == "7"
