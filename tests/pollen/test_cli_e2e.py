"""End to end: `pollen deploy` and `pollen simulate` as a user runs them, real Flower processes
talking gRPC (deploy) or Ray (simulate) on this machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from client.state import StateStore
from pollen.core.rundir import read_jsonl

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
POLLEN = [sys.executable, "-m", "pollen.tools.cli"]
ROOT = Path(__file__).resolve().parents[2]


def _processes_under(directory: Path) -> list[str]:
    """Live processes whose environment or command line points into `directory`."""
    found = []
    needle = str(directory).encode()
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                env = fh.read()
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read()
            with open(f"/proc/{pid}/stat") as fh:
                state = fh.read().split(") ")[-1][:1]
        except OSError:
            continue
        if state != "Z" and (needle in env or needle in cmd):
            found.append(cmd.replace(b"\0", b" ").decode(errors="replace"))
    return found


def _pollen(
    command: str, *extra: str, cache: Path, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """`pollen <command words> <extra>` in a subprocess, as a user would type it."""
    env = dict(os.environ, POLLEN_CACHE_DIR=str(cache), FLWR_TELEMETRY_ENABLED="0")
    argv = [*POLLEN, *command.split(), *extra]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)


def test_deploy_two_supernodes_over_grpc(tmp_path: Path, shared_cache: Path) -> None:
    out = tmp_path / "run"
    done = _pollen(
        "deploy --algorithm fedavg --dataset mnist-5k --clients 2 --rounds 2 "
        "--set poll-interval=0.5 --set lr=0.1",
        "--out", str(out), cache=shared_cache,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["round"] for r in rows] == [1, 2]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed"
    start = rows[0]["train"]["test-accuracy"]  # the untrained initial model
    assert rows[1]["train"]["test-accuracy"] > start + 0.3
    assert summary["final"]["eval"]["test-accuracy"] > rows[1]["train"]["test-accuracy"] - 0.05
    assert "round 2" in done.stdout and "valid replies" in done.stdout
    # the SuperNodes really spoke gRPC to the SuperLink's fleet port
    superlink_log = (out / "processes" / "superlink.log").read_text()
    assert "Fleet API (gRPC-rere)" in superlink_log
    time.sleep(1.0)
    assert _processes_under(out) == []


def test_deploy_fedem_keeps_pi_on_the_nodes_and_serves_an_unseen_client(
    tmp_path: Path, shared_cache: Path
) -> None:
    """FedEM over gRPC: 3 SuperNodes, one held out of training and served at the end."""
    out = tmp_path / "fedem"
    done = _pollen(
        "deploy --algorithm fedem --dataset digits --clients 3 --rounds 2 "
        "--set fedem.components=2 --set unseen-fraction=0.34 "
        "--set poll-interval=0.5 --set lr=0.1",
        "--out", str(out), cache=shared_cache,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed"
    final = summary["final"]["eval"]
    assert final["clients"] == 2.0 and final["unseen-clients"] == 1.0
    assert final["unseen-em-iterations"] >= 1
    assert final["unseen-test-accuracy"] > 0.3 and final["test-accuracy"] > 0.3
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["train"]["clients"] for r in rows] == [2.0, 2.0]
    # each training client's pi, written by its ClientApp processes, on the simplex
    stores = [StateStore(d) for d in sorted((out / "client-state").glob("*/client-*"))]
    saved = [s.load(before_round=10**6) for s in stores]
    assert len([x for x in saved if x is not None]) == 2, stores  # the unseen one stores nothing
    for arrays, meta in filter(None, saved):
        assert meta["round"] == 2
        assert arrays["pi"].shape == (2,) and abs(float(arrays["pi"].sum()) - 1.0) < 1e-9
    time.sleep(1.0)
    assert _processes_under(out) == []


def test_deploy_exits_nonzero_when_the_run_fails(tmp_path: Path, shared_cache: Path) -> None:
    out = tmp_path / "failing"
    done = _pollen(
        "deploy --dataset digits --clients 2 --rounds 1 --set phase-timeout=0.2 "
        "--set wait-for-clients=2",
        "--out", str(out), cache=shared_cache, timeout=300,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    # one readable line: the run's reason and where the full log is
    [error] = [line for line in done.stderr.splitlines() if line.startswith("pollen: error:")]
    # deploy requires one client unless told (min-available-clients), and names the missing
    assert "failed: PhaseFailed: only 0 of the 1 required clients connected within 2 s" in error
    assert "missing: client(s) 0, 1" in error
    assert f"(full log: {out / 'server.log'})" in error
    assert "Traceback" not in done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert "required clients connected within 2 s" in summary["reason"]
    time.sleep(1.0)
    assert _processes_under(out) == []


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ("--algorithm fedfoo", "unknown algorithm"),
        ("--dataset nope", "nope"),
        ("--set lr=fast", "setting 'lr'"),
        ("--set partitioner=classes --set classes-per-client=11", "classes_per_client"),
        ("--set no-such-key=1", "unknown setting"),
    ],
)
def test_bad_settings_fail_before_anything_starts(
    tmp_path: Path, shared_cache: Path, options: str, message: str
) -> None:
    done = _pollen(f"deploy {options}", "--out", str(tmp_path / "x"), cache=shared_cache)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert not (tmp_path / "x" / "processes").exists()


def test_simulate_runs_on_the_simulation_runtime(tmp_path: Path, shared_cache: Path) -> None:
    out = tmp_path / "sim"
    done = _pollen(
        "simulate --dataset digits --clients 3 --rounds 2 --set poll-interval=0.2 --set lr=0.1",
        "--out", str(out), cache=shared_cache,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["round"] for r in rows] == [1, 2]
    assert rows[1]["train"]["clients"] == 3.0
    assert rows[1]["train"]["test-accuracy"] > rows[0]["train"]["test-accuracy"] + 0.2
    time.sleep(1.0)
    assert _processes_under(out) == []


def test_simulate_results_do_not_depend_on_the_packing_or_parallelism(
    tmp_path: Path, shared_cache: Path
) -> None:
    """FedEM (personal state on the clients) packed two nodes for five clients, two at once,
    against one node per client, one at a time: the same final models and metrics."""
    runs = {}
    for tag, flags in (("packed", "--nodes 2 --parallel 2"), ("one", "--nodes 5 --parallel 1")):
        out = tmp_path / tag
        done = _pollen(
            f"simulate --algorithm fedem --dataset digits --clients 5 --rounds 2 {flags} "
            "--set fedem.components=2 --set poll-interval=0.2",
            "--out", str(out), cache=shared_cache,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        runs[tag] = out
        if tag == "packed":
            assert "5 clients on 2 simulated SuperNodes" in done.stdout
    packed, one = (np.load(runs[t] / "final_model.npz") for t in ("packed", "one"))
    assert sorted(packed.files) == sorted(one.files)
    for key in one.files:
        np.testing.assert_array_equal(packed[key], one[key], err_msg=key)

    def results(out: Path) -> list[dict[str, object]]:
        rows = read_jsonl(out / "metrics.jsonl")
        return [{k: r[k] for k in ("round", "train", "server-eval") if k in r} for r in rows]

    assert results(runs["packed"]) == results(runs["one"])
    summaries = [json.loads((runs[t] / "summary.json").read_text()) for t in ("packed", "one")]
    assert summaries[0]["final"]["eval"] == summaries[1]["final"]["eval"]


def test_server_client_and_run_commands(tmp_path: Path, shared_cache: Path) -> None:
    """The multi-machine path, on loopback: `pollen server`, two `pollen client`, `pollen run`."""
    from pollen.tools.processes import free_port

    port, fleet = free_port(), free_port()
    base = dict(os.environ, POLLEN_CACHE_DIR=str(shared_cache), FLWR_TELEMETRY_ENABLED="0")

    def start(args: list[str], home: str) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [*POLLEN, *args], env=dict(base, FLWR_HOME=str(tmp_path / home)),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip

    certs = tmp_path / "certs"
    subprocess.run(["bash", str(ROOT / "scripts" / "generate-certs.sh"), str(certs)], check=True,
                   capture_output=True)  # fmt: skip
    procs = [start(["server", "--insecure", "--fleet-host", "127.0.0.1", "--port", str(port),
                    "--fleet-port", str(fleet)], "link")]  # fmt: skip
    try:
        for i in range(2):  # each on a free local port of its own (no --port)
            procs.append(start([
                "client", "--superlink", f"127.0.0.1:{fleet}", "--partition-id", str(i),
                "--num-partitions", "2", "--state-dir", str(tmp_path / f"state{i}"),
                "--insecure", "--trusted-key", str(certs / "signing.pub"),
            ], f"node{i}"))  # fmt: skip
        out = tmp_path / "run"
        deadline = time.monotonic() + 120
        while True:  # the SuperLink takes a few seconds to listen
            done = _pollen(
                "run --algorithm local --dataset digits --clients 2 --rounds 2 "
                "--set poll-interval=0.5 --set client-timing=true",
                "--superlink", f"127.0.0.1:{port}", "--out", str(out),
                "--signing-key", str(certs / "signing.key"), cache=shared_cache,
            )  # fmt: skip
            if done.returncode == 0 or "flwr run failed" not in done.stderr:
                break
            if time.monotonic() > deadline:
                break
            time.sleep(2)
        assert done.returncode == 0, done.stdout + done.stderr
        rows = read_jsonl(out / "metrics.jsonl")
        assert [r["round"] for r in rows] == [1, 2] and rows[1]["train"]["clients"] == 2.0
        # every message went through each client's resident worker (time-relay: the relay's
        # part), none imported torch in the ClientApp process
        replies = read_jsonl(out / "clients.jsonl")
        assert replies and all("time-relay" in r["metrics"] for r in replies)
        assert all(r["metrics"]["time-import-torch"] == 0.0 for r in replies)
        # each client kept its personal model in its own state directory
        for i in range(2):
            saved = list((tmp_path / f"state{i}").rglob("state-*.npz"))
            assert len(saved) == 2, saved
        # the same federation, another run: FedAvg whose server sees only the sums
        secure = tmp_path / "secure"
        done = _pollen(
            "run --algorithm fedavg --dataset digits --clients 2 --rounds 1 "
            "--set poll-interval=0.5 --set secagg.enabled=true",
            "--superlink", f"127.0.0.1:{port}", "--out", str(secure),
            "--signing-key", str(certs / "signing.key"), cache=shared_cache,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        rows = read_jsonl(secure / "metrics.jsonl")
        assert [p["phase"] for p in rows[0]["phases"]] == [
            "query.secagg_keys", "query.secagg_shares", "train", "query.secagg_consistency",
            "query.secagg_unmask",
        ]  # fmt: skip
        assert rows[0]["train"]["clients"] == 2.0
        assert json.loads((secure / "summary.json").read_text())["secure-aggregation"]
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)


def test_deploy_with_tls(tmp_path: Path, shared_cache: Path) -> None:
    certs = tmp_path / "certs"
    script = Path(__file__).resolve().parents[2] / "scripts" / "generate-certs.sh"
    subprocess.run(
        ["bash", str(script), str(certs), "--nodes", "2"], check=True, capture_output=True
    )
    out = tmp_path / "tls"
    done = _pollen(
        "deploy --dataset digits --clients 2 --rounds 1 --set poll-interval=0.5 "
        "--set final-eval=false --auth",
        "--out", str(out), "--tls-dir", str(certs), cache=shared_cache,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "with TLS and node authentication" in done.stdout
    log = (out / "processes" / "superlink.log").read_text()
    assert "running on https://" in log and "--insecure" not in log
    for i in range(2):  # each node signed in with its own registered key
        node_log = (out / "processes" / f"supernode-{i}.log").read_text()
        assert "SuperNode ID" in node_log and "Failed to activate" not in node_log
    assert read_jsonl(out / "metrics.jsonl")[0]["train"]["clients"] == 2.0
    missing = _pollen(
        "deploy", "--out", str(tmp_path / "x"), "--tls-dir", str(tmp_path), cache=shared_cache
    )
    assert missing.returncode == 2 and "ca.crt" in missing.stderr


@pytest.mark.parametrize(
    ("command", "running"),
    [
        pytest.param("deploy", "flwr-serverapp", id="deploy"),
        # once Ray's node is up (its agents start with the raylet), before any round: the
        # flwr-simulation and Ray's processes below it are what used to outlive the launcher
        pytest.param("simulate", "ray::", id="simulate"),
    ],
)
def test_killing_the_launcher_leaves_no_process_behind(
    tmp_path: Path, shared_cache: Path, command: str, running: str
) -> None:
    out = tmp_path / "killed"
    env = dict(os.environ, POLLEN_CACHE_DIR=str(shared_cache), FLWR_TELEMETRY_ENABLED="0")
    with open(tmp_path / "launcher.log", "w") as log:
        proc = subprocess.Popen(
            [*POLLEN, command, "--dataset", "digits", "--clients", "2", "--rounds", "50",
             "--out", str(out)],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    deadline = time.monotonic() + 240
    while not any(running in p for p in _processes_under(out)):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"no {running} process: {(tmp_path / 'launcher.log').read_text()}")
        time.sleep(0.5)
    proc.kill()  # SIGKILL: no chance to clean up by itself
    proc.wait()
    deadline = time.monotonic() + 60
    while _processes_under(out) and time.monotonic() < deadline:
        time.sleep(1)
    assert _processes_under(out) == []
