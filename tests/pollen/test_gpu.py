"""GPUs and Ray clusters from the command line (docs/deployment.md#gpu), on a CPU-only machine:
CUDA is mocked present or absent, Flower's processes are faked except where a test says so."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from pollen.core import registry, runconfig
from pollen.core.settings import SettingsError, parse_assignments
from pollen.tools import cli, node_service, processes
from pollen.tools.cli import client as client_command
from pollen.tools.cli import deploy, simulate
from pollen.tools.cli.gpu import cuda_devices
from pollen.tools.cli.parser import build_parser
from pollen.tools.local_federation import LocalFederation
from pollen.tools.node_service import serve_node
from pollen.tools.processes import bin_path

ROOT = Path(__file__).resolve().parents[2]
SIMULATE = ["simulate", "--dataset", "digits", "--clients", "2", "--rounds", "1"]
DEPLOY = ["deploy", "--dataset", "digits", "--clients", "3", "--rounds", "1"]


def _cuda(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


class FakeFederation:
    """What cmd_simulate and cmd_deploy ask of a LocalFederation, recorded."""

    made: ClassVar[list[FakeFederation]] = []

    def __init__(self, workdir: Path, **kwargs: Any) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = workdir
        self.env: dict[str, str] = {}
        self.simulation: tuple[Any, ...] = ()
        self.nodes: list[dict[str, str] | None] = []
        FakeFederation.made.append(self)

    def start_superlink(self, **kwargs: Any) -> tuple[int, int]:
        return 0, 1

    def configure_simulation(self, *args: Any) -> None:
        self.simulation = args

    def sign_apps_with_new_key(self) -> None:
        pass

    def register_nodes(self, keys: Any) -> int:
        return 0

    def start_supernode(
        self, *args: Any, env_extra: dict[str, str] | None = None, **kwargs: Any
    ) -> None:
        self.nodes.append(env_extra)

    def wait_nodes(self, count: int) -> None:
        pass

    def spread_task_polls(self, *args: Any, **kwargs: Any) -> None:
        pass

    def stop(self) -> None:
        pass


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[FakeFederation]]:
    FakeFederation.made = []
    monkeypatch.setattr(deploy, "LocalFederation", FakeFederation)
    monkeypatch.setattr(simulate, "LocalFederation", FakeFederation)
    monkeypatch.setattr(deploy, "run_and_report", lambda *a, **k: 0)
    monkeypatch.setattr(simulate, "run_and_report", lambda *a, **k: 0)
    monkeypatch.setattr(simulate, "simulate_run", lambda *a, **k: 0)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    yield FakeFederation.made


def _main(argv: list[str], tmp_path: Path, cache: Path) -> int:
    return cli.main([*argv, "--out", str(tmp_path / "run"), "--set", f"cache-dir={cache}"])


def _one_error_line(capsys: pytest.CaptureFixture[str], *words: str) -> None:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("pollen: error: "), err
    for word in words:
        assert word in err[0], err[0]


# ---- simulate --gpus-per-client ---------------------------------------------------------
def test_ray_client_resources_carry_the_gpu_share(
    fake: list[FakeFederation], tmp_path: Path, shared_cache: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    _cuda(monkeypatch, 2)
    assert _main([*SIMULATE, "--gpus-per-client", "0.5"], tmp_path, shared_cache) == 0
    (fed,) = fake
    num_supernodes, _cpus, share, gpus = fed.simulation
    assert (num_supernodes, share, gpus) == (2, 0.5, 2)
    assert fed.env["RAY_ADDRESS"] == "local"  # a Ray of its own, never a stray `ray start`


def test_without_gpus_clients_reserve_none(
    fake: list[FakeFederation], tmp_path: Path, shared_cache: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    _cuda(monkeypatch, 0)
    assert _main(SIMULATE, tmp_path, shared_cache) == 0
    assert fake[0].simulation[2:] == (0.0, None)


def test_configure_simulation_passes_the_share_to_flower(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fed = LocalFederation(tmp_path / "w")
    calls: list[tuple[str, ...]] = []

    def flwr(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        calls.append(args)
        return subprocess.CompletedProcess(list(args), 0, "", "")

    monkeypatch.setattr(fed, "flwr", flwr)
    fed.configure_simulation(4, 1, 0.25, 2)
    fed.configure_simulation(4, 1)
    gpu, cpu = calls
    assert gpu[:2] == ("federation", "simulation-config")
    assert _option(gpu, "--client-resources-num-gpus") == "0.25"
    assert _option(gpu, "--init-args-num-gpus") == "2"
    assert _option(gpu, "--num-supernodes") == "4" and _option(cpu, "--num-supernodes") == "4"
    assert "--client-resources-num-gpus" not in cpu and "--init-args-num-gpus" not in cpu


def _option(argv: tuple[str, ...], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_flower_knows_the_gpu_options() -> None:
    """The options configure_simulation passes exist in this Flower's CLI."""
    done = subprocess.run(
        [bin_path("flwr"), "federation", "simulation-config", "--help"],
        capture_output=True, text=True, timeout=120,
        env=dict(os.environ, COLUMNS="200", FLWR_TELEMETRY_ENABLED="0"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    for option in ("--client-resources-num-gpus", "--init-args-num-gpus", "--num-supernodes"):
        assert option in done.stdout


@pytest.mark.parametrize(
    ("extra", "gpus", "words"),
    [
        (["--gpus-per-client", "0.5"], 0, ["torch sees no CUDA GPU"]),
        (["--gpus-per-client", "3"], 2, ["this machine has 2 CUDA GPUs"]),
        (["--gpus-per-client", "1.5"], 2, ["a fraction of one GPU or a whole number"]),
        (["--gpus-per-client", "-1"], 2, ["must be 0 or more"]),
        (["--gpus-per-client", "0.5", "--set", "device=cpu"], 2, ["device=cpu"]),
        (["--set", "device=cuda"], 2, ["needs --gpus-per-client above 0"]),
    ],
)
def test_impossible_gpu_requests_stop_simulate_before_anything_starts(
    fake: list[FakeFederation], tmp_path: Path, shared_cache: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    extra: list[str], gpus: int, words: list[str],
) -> None:  # fmt: skip
    _cuda(monkeypatch, gpus)
    assert _main([*SIMULATE, *extra], tmp_path, shared_cache) == 2
    _one_error_line(capsys, *words)
    assert fake == [] and not (tmp_path / "run").exists()


# ---- simulate --ray-address ---------------------------------------------------------------
@pytest.fixture
def listener() -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield f"127.0.0.1:{s.getsockname()[1]}"


def test_a_ray_cluster_is_handed_to_the_simulation(
    fake: list[FakeFederation], tmp_path: Path, shared_cache: Path, listener: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    _cuda(monkeypatch, 0)  # the cluster's nodes have the GPUs, not this machine
    argv = [*SIMULATE, "--ray-address", listener, "--gpus-per-client", "1"]
    assert _main(argv, tmp_path, shared_cache) == 0
    (fed,) = fake
    assert fed.env["RAY_ADDRESS"] == listener
    assert fed.simulation[1] == 1  # one CPU per client: Ray packs them on the cluster's nodes
    assert fed.simulation[2:] == (1.0, None)  # no init args: the cluster declares its GPUs


@pytest.mark.parametrize("value", ["listener", "auto"])
def test_ray_address_from_the_environment(
    fake: list[FakeFederation], tmp_path: Path, shared_cache: Path, listener: str,
    monkeypatch: pytest.MonkeyPatch, value: str,
) -> None:  # fmt: skip
    address = listener if value == "listener" else value
    monkeypatch.setenv("RAY_ADDRESS", address)
    assert _main(SIMULATE, tmp_path, shared_cache) == 0
    assert fake[0].env["RAY_ADDRESS"] == address


@pytest.mark.parametrize(
    ("address", "words"),
    [
        ("head-node", ["is not HOST:PORT", "ray start --head"]),
        ("ray://10.0.0.5:10001", ["is not HOST:PORT"]),
        ("10.0.0.5:99999", ["is not HOST:PORT"]),
    ],
)
def test_a_bad_ray_address_is_one_line(
    fake: list[FakeFederation], tmp_path: Path, shared_cache: Path,
    capsys: pytest.CaptureFixture[str], address: str, words: list[str],
) -> None:  # fmt: skip
    assert _main([*SIMULATE, "--ray-address", address], tmp_path, shared_cache) == 2
    _one_error_line(capsys, "--ray-address", *words)
    assert fake == [] and not (tmp_path / "run").exists()


def test_a_ray_address_nobody_answers_is_one_line(
    fake: list[FakeFederation], tmp_path: Path, shared_cache: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    address = f"127.0.0.1:{processes.free_port()}"
    assert _main([*SIMULATE, "--ray-address", address], tmp_path, shared_cache) == 2
    _one_error_line(capsys, "no Ray cluster answers there")
    assert fake == []


# ---- deploy --gpus, client --gpu ------------------------------------------------------------
def test_deploy_spreads_supernodes_over_the_gpus_round_robin(
    fake: list[FakeFederation], tmp_path: Path, shared_cache: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    _cuda(monkeypatch, 4)
    assert _main([*DEPLOY, "--gpus", "1,3"], tmp_path, shared_cache) == 0
    assert fake[0].nodes == [
        {"CUDA_VISIBLE_DEVICES": "1"},
        {"CUDA_VISIBLE_DEVICES": "3"},
        {"CUDA_VISIBLE_DEVICES": "1"},
    ]


def test_deploy_without_gpus_leaves_the_environment_alone(
    fake: list[FakeFederation], tmp_path: Path, shared_cache: Path,
) -> None:  # fmt: skip
    assert _main(DEPLOY, tmp_path, shared_cache) == 0
    assert fake[0].nodes == [{}, {}, {}]


@pytest.mark.parametrize(
    ("gpus", "present", "words"),
    [
        ("0,1", 0, ["--gpus 0,1", "torch sees no CUDA GPU"]),
        ("0,2", 2, ["torch sees 2 CUDA GPUs here (0 to 1)"]),
        ("a,b", 2, ["expected GPU indices"]),
        ("0,0", 2, ["distinct"]),
    ],
)
def test_absent_gpus_stop_deploy_before_anything_starts(
    fake: list[FakeFederation], tmp_path: Path, shared_cache: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    gpus: str, present: int, words: list[str],
) -> None:  # fmt: skip
    _cuda(monkeypatch, present)
    assert _main([*DEPLOY, "--gpus", gpus], tmp_path, shared_cache) == 2
    _one_error_line(capsys, *words)
    assert fake == []


def test_start_supernode_puts_the_gpu_into_the_nodes_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real LocalFederation.start_supernode: env_extra reaches the process it spawns."""
    fed = LocalFederation(tmp_path / "w")
    spawned: dict[str, dict[str, str]] = {}

    def spawn(name: str, argv: Any, env: Any = None, **kwargs: Any) -> Any:
        spawned[name] = dict(env)
        return processes.Proc(name, None, tmp_path / "log")  # type: ignore[arg-type]

    monkeypatch.setattr(fed, "spawn", spawn)
    fed.start_supernode(0, 2, "127.0.0.1:1", env_extra={"CUDA_VISIBLE_DEVICES": "1"})
    fed.start_supernode(1, 2, "127.0.0.1:1")
    node0, node1 = spawned["supernode-0"], spawned["supernode-1"]
    assert node0["CUDA_VISIBLE_DEVICES"] == "1" and node0["FLWR_HOME"].endswith("node-0")
    assert node1.get("CUDA_VISIBLE_DEVICES") == os.environ.get("CUDA_VISIBLE_DEVICES")
    # whatever else runs beside node 0 (its resident worker, which trains) sees the same GPU
    assert "worker-0" in spawned
    for name, env in spawned.items():
        if name.endswith("-0"):
            assert env["CUDA_VISIBLE_DEVICES"] == "1", name


CLIENT = ["client", "--superlink", "127.0.0.1:9092", "--partition-id", "0",
          "--num-partitions", "2", "--insecure", "--allow-any-app"]  # fmt: skip


def test_client_gpu_sets_its_nodes_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _cuda(monkeypatch, 2)
    seen: list[Any] = []

    def serve(*args: Any, env_extra: dict[str, str] | None = None, **kwargs: Any) -> int:
        seen.append(env_extra)
        return 0

    monkeypatch.setattr(client_command, "serve_node", serve)
    state = ["--state-dir", str(tmp_path / "state")]
    assert cli.main([*CLIENT, *state, "--gpu", "1"]) == 0
    assert cli.main([*CLIENT, *state]) == 0
    assert seen == [{"CUDA_VISIBLE_DEVICES": "1"}, {}]


@pytest.mark.parametrize(("gpu", "present", "words"), [
    ("1", 1, ["--gpu 1", "torch sees 1 CUDA GPU here (0 to 0)"]),
    ("0", 0, ["--gpu 0", "torch sees no CUDA GPU"]),
    ("-1", 1, ["GPU index"]),
])  # fmt: skip
def test_client_with_an_absent_gpu_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    gpu: str, present: int, words: list[str],
) -> None:  # fmt: skip
    _cuda(monkeypatch, present)
    monkeypatch.setattr(client_command, "serve_node", lambda *a, **k: pytest.fail("started a node"))
    argv = [*CLIENT, "--state-dir", str(tmp_path / "state"), "--gpu", gpu]
    assert cli.main(argv) == 2
    _one_error_line(capsys, *words)


def test_serve_node_passes_env_extra_to_the_node(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """The real serve_node, with a stand-in for flower-supernode that prints its device."""
    monkeypatch.setattr(node_service.signal, "signal", lambda *a: None)  # keep pytest's handlers
    program = "import os; print('visible=' + os.environ['CUDA_VISIBLE_DEVICES'])"
    argv = [Path(sys.executable).name, "-c", program]
    assert serve_node(argv, None, "x:1", None, env_extra={"CUDA_VISIBLE_DEVICES": "3"}) == 0
    assert "visible=3" in capfd.readouterr().out


# ---- amp ------------------------------------------------------------------------------------
def test_amp_is_for_the_algorithms_that_declare_it() -> None:
    for name, spec in registry.ALGORITHMS.items():
        if spec.amp:
            assert runconfig.resolve({"algorithm": name, "amp": True})["amp"] is True
            continue
        with pytest.raises(SettingsError, match=f"amp=true: {name} trains in float32 only"):
            runconfig.resolve({"algorithm": name, "amp": True})
    # the shared loops have it; float32 by construction where the math must stay float32
    assert registry.get_algorithm("fedavg").amp and registry.get_algorithm("fedem").amp
    for name in ("fedlrt", "fedlin", "fedsc", "fedavg-sc"):
        assert not registry.get_algorithm(name).amp


def test_amp_refused_is_one_line_before_anything_starts(
    fake: list[FakeFederation], tmp_path: Path, shared_cache: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    argv = [*SIMULATE, "--algorithm", "fedlrt", "--set", "amp=true"]
    assert _main(argv, tmp_path, shared_cache) == 2
    _one_error_line(capsys, "amp=true: fedlrt trains in float32 only")
    assert fake == []


# ---- scripts/gpu-check.sh -----------------------------------------------------------------
def _gpu_check() -> Any:
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_check_says_there_is_no_gpu_and_exits_0() -> None:
    done = subprocess.run(
        [str(ROOT / "scripts" / "gpu-check.sh")], capture_output=True, text=True, timeout=300,
        env=dict(os.environ, PYTHON=sys.executable),
    )  # fmt: skip
    if cuda_devices():
        pytest.skip("this machine has a GPU: scripts/gpu-check.sh would train")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines() == [
        "gpu-check: torch sees no CUDA GPU on this machine; nothing to compare (exit 0)"
    ]


@pytest.mark.parametrize("mode", ["simulate", "deploy"])
def test_gpu_check_commands_are_valid_for_every_algorithm(tmp_path: Path, mode: str) -> None:
    """Each command gpu-check runs parses, and its settings pass the checks a run makes
    (amp only where the algorithm has it), on CUDA and on the CPU."""
    gpu_check = _gpu_check()
    parser = build_parser()
    for name, spec in registry.ALGORITHMS.items():
        for device in ("cuda", "cpu"):
            argv = gpu_check.pollen_argv(mode, name, device, 2, spec.amp, 1, tmp_path / "r")
            args = parser.parse_args(argv[3:])
            overrides = {**parse_assignments(args.set), "algorithm": args.algorithm}
            assert runconfig.resolve(overrides)["device"] == device
            assert runconfig.foreign_settings(name, overrides) == {}
            if device == "cuda":
                assert (args.gpus_per_client if mode == "simulate" else args.gpus) in (0.5, "0,1")
