"""An operator's ordinary actions on real `pollen` processes (no Docker): a SuperNode of
`pollen deploy` killed mid-round, two `pollen client` on one machine, a client whose SuperLink
never answers, `pollen run` against an unreachable SuperLink. Each leaves nothing running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from client import relay, resident
from pollen.core.rundir import read_jsonl
from pollen.tools.processes import free_port
from tests.pollen.test_cli_e2e import POLLEN, _processes_under
from tests.pollen.test_faults_e2e import TIMEOUT, _digests, _started, _wait

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _env(cache: Path, home: Path) -> dict[str, str]:
    return dict(os.environ, POLLEN_CACHE_DIR=str(cache), FLWR_TELEMETRY_ENABLED="0",
                FLWR_HOME=str(home))  # fmt: skip


def _supernode_pid(out: Path, partition: int) -> int:
    """The `flower-supernode` process of client `partition` in a deploy writing to `out`."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        text = b" ".join(argv)
        if b"flower-supernode" in text and f"partition-id={partition} ".encode() in text + b" " \
                and str(out).encode() in text:  # fmt: skip
            return int(entry.name)
    raise AssertionError(f"no SuperNode of client {partition} under {out}")


def test_deploy_restarts_a_killed_supernode_and_the_run_completes(
    tmp_path: Path, shared_cache: Path
) -> None:
    """SIGKILL one FedEM SuperNode of `pollen deploy` in round 2: deploy restarts it on the same
    partition and state directory, the run completes, summary.json and the progress output say
    which node restarted and when, and the client's stored state is byte-identical after the
    restart."""
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [*POLLEN, "deploy", "--algorithm", "fedem", "--dataset", "digits", "--clients", "3",
         "--rounds", "3", "--out", str(out), "--set", "fedem.components=2",
         "--set", f"phase-timeout={TIMEOUT}", "--set", "poll-interval=0.5",
         "--set", "final-eval=false", "--set", "lr=0.1"],
        env=_env(shared_cache, tmp_path / "home"), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        _wait("round 2 training", _started(out, 2, "train"))
        client_dir = next((out / "client-state").glob("*/client-2"))
        pid = _supernode_pid(out, 2)
        os.kill(pid, signal.SIGKILL)
        time.sleep(1.0)
        at_kill = _digests(client_dir)
        output, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, output[-4000:]
    assert "SuperNode of client 2 exited (code -9); restarting it" in output
    assert "SuperNode of client 2 restarted (it exited with code -9; restart 1 of" in output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed"
    [restart] = summary["node-restarts"]
    assert restart["client"] == 2 and restart["exit-code"] == -9 and restart["restart"] == 1
    assert restart["time"].endswith("Z")
    events = [e for e in read_jsonl(out / "events.jsonl") if e.get("event") == "node-restarted"]
    assert events == [restart]
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["round"] for r in rows] == [1, 2, 3]
    assert rows[2]["train"]["clients"] == 3.0  # the restarted node trained again in round 3
    now = _digests(client_dir)
    assert "state-000001.npz" in at_kill
    for name, digest in at_kill.items():
        assert now[name] == digest, name  # what was stored before the kill is untouched
    time.sleep(1.0)
    assert _processes_under(out) == []


def _client(tmp: Path, partition: int, fleet: int, cache: Path, *extra: str) -> list[str]:
    return [*POLLEN, "client", "--superlink", f"127.0.0.1:{fleet}", "--partition-id",
            str(partition), "--num-partitions", "2", "--state-dir", str(tmp / f"s{partition}"),
            "--insecure", "--allow-any-app", *extra]  # fmt: skip


def test_two_clients_on_one_machine_each_take_a_free_port(
    tmp_path: Path, shared_cache: Path
) -> None:
    port, fleet = free_port(), free_port()
    env = _env(shared_cache, tmp_path / "home")
    procs = [subprocess.Popen([*POLLEN, "server", "--insecure", "--fleet-host", "127.0.0.1",
                               "--port", str(port), "--fleet-port", str(fleet)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)]  # fmt: skip
    logs = [tmp_path / f"client{i}.log" for i in range(2)]
    try:
        for i in range(2):
            with open(logs[i], "wb") as fh:
                procs.append(subprocess.Popen(
                    _client(tmp_path, i, fleet, shared_cache),
                    env=_env(shared_cache, tmp_path / f"home{i}"), stdout=fh,
                    stderr=subprocess.STDOUT, start_new_session=True))  # fmt: skip
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            texts = [log.read_text(errors="replace") for log in logs]
            if all("SuperNode ID" in t or "Starting Flower SuperNode" in t for t in texts):
                break
            time.sleep(0.5)
        time.sleep(5)
        for proc in procs:
            assert proc.poll() is None, [log.read_text(errors="replace")[-2000:] for log in logs]
        texts = [log.read_text(errors="replace") for log in logs]
        ports = [t.split(" --port ")[1].split()[0] for t in texts]
        assert ports[0] != ports[1]
        assert all("address already in use" not in t.lower() for t in texts)
        # each its own resident worker, on its own socket, serving
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all("serving" in t for t in texts):
            time.sleep(0.5)
            texts = [log.read_text(errors="replace") for log in logs]
        sockets = [t.split("pollen worker ")[1].split("serving ")[1].split()[0] for t in texts]
        assert sockets[0] != sockets[1]
        assert all(relay._exchange(Path(s), {"op": "ping"}, ()) is not None for s in sockets)
    finally:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def test_a_client_that_cannot_connect_gives_up_with_one_line(
    tmp_path: Path, shared_cache: Path
) -> None:
    nothing = free_port()  # nobody listens here
    done = subprocess.run(_client(tmp_path, 0, nothing, shared_cache, "--max-wait-time", "5"),
                          env=_env(shared_cache, tmp_path / "home"), capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if line.startswith("pollen: error:")]
    assert len(errors) == 1, done.stderr
    assert f"127.0.0.1:{nothing} within 5 s" in errors[0]
    assert "nothing listening there" in errors[0] and "TLS mismatch" in errors[0]
    assert "Traceback" not in done.stderr
    time.sleep(1.0)
    assert _processes_under(tmp_path) == []


def test_pollen_run_shows_its_wait_and_leaves_nothing_when_it_gives_up(
    tmp_path: Path, shared_cache: Path
) -> None:
    nothing = free_port()
    out = tmp_path / "never"
    done = subprocess.run(
        [*POLLEN, "run", "--superlink", f"127.0.0.1:{nothing}", "--dataset", "digits",
         "--clients", "2", "--out", str(out), "--wait-superlink", "8"],
        env=_env(shared_cache, tmp_path / "home"), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"waiting for the SuperLink at 127.0.0.1:{nothing}" in done.stdout
    errors = [line for line in done.stderr.splitlines() if line.startswith("pollen: error:")]
    assert len(errors) == 1 and f"no SuperLink answers at 127.0.0.1:{nothing}" in errors[0]
    assert not out.exists()


def _worker_pid(out: Path, partition: int) -> int:
    """The resident worker `pollen deploy` started beside client `partition`'s SuperNode."""
    home = f"FLWR_HOME={out / 'processes' / f'node-{partition}'}\0".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes()
            env = (entry / "environ").read_bytes()
        except OSError:
            continue
        if b"client.worker" in argv and home in env:
            return int(entry.name)
    raise AssertionError(f"no worker of client {partition} under {out}")


def _deploy_fedem(out: Path, cache: Path, home: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*POLLEN, "deploy", "--algorithm", "fedem", "--dataset", "digits", "--clients", "3",
         "--rounds", "3", "--out", str(out), "--set", "fedem.components=2",
         "--set", f"phase-timeout={TIMEOUT}", "--set", "poll-interval=0.5",
         "--set", "lr=0.1", "--set", "client-timing=true", *extra],
        env=_env(cache, home), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip


def _results(out: Path) -> list[dict[str, object]]:
    """Every client's reply metrics per round, timing figures left out."""
    rows = read_jsonl(out / "clients.jsonl")
    return [
        {**r, "metrics": {k: v for k, v in r["metrics"].items()
                          if not k.startswith(("time-", "peak-rss", "relay-peak-rss"))}}
        for r in sorted(rows, key=lambda r: (r["round"], r["phase"], r["client-id"]))
    ]  # fmt: skip


def test_deploy_a_killed_worker_is_replaced_and_the_results_are_unchanged(
    tmp_path: Path, shared_cache: Path
) -> None:
    """SIGKILL the resident worker of one FedEM client in round 2: its next message starts a
    new worker (or its ClientApp answers itself), the run completes, and every reply and the
    final model equal a run without resident workers."""
    out = tmp_path / "run"
    # a worker for each node (deploy's default is one shared by all its nodes)
    proc = _deploy_fedem(out, shared_cache, tmp_path / "home", "--worker-per-node")
    try:
        _wait("round 2 training", _started(out, 2, "train"))
        pid = _worker_pid(out, 2)
        os.kill(pid, signal.SIGKILL)
        output, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, output[-4000:]
    log = (out / "processes" / "app-runner-2.log").read_text()
    assert "starting a worker for this node" in log or "runs the handler itself" in log, log
    relayed = [r for r in read_jsonl(out / "clients.jsonl") if "time-relay" in r["metrics"]]
    assert len(relayed) >= 9  # every client's train messages went through a worker but one
    # the relaying ClientApp processes never imported torch (which alone takes ~500 MB here)
    assert max(r["metrics"]["relay-peak-rss-mb"] for r in relayed) < 300

    plain = tmp_path / "no-worker"
    again = _deploy_fedem(plain, shared_cache, tmp_path / "home2", "--no-worker")
    output, _ = again.communicate(timeout=600)
    assert again.returncode == 0, output[-4000:]
    assert not any("time-relay" in r["metrics"] for r in read_jsonl(plain / "clients.jsonl"))
    assert _results(out) == _results(plain)
    with np.load(out / "final_model.npz") as a, np.load(plain / "final_model.npz") as b:
        assert sorted(a.files) == sorted(b.files)
        for name in a.files:
            assert np.array_equal(a[name], b[name]), name
    time.sleep(1.5)
    assert _processes_under(out) == [] and _processes_under(plain) == []
    for i in range(3):  # nothing of the nodes' workers is left beside their sockets
        sock = resident.socket_path(str((out / "processes" / f"node-{i}").resolve()))
        assert not sock.exists() and not resident.owner_lock(sock).exists()
