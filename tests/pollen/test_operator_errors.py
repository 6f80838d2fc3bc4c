"""Every operator mistake, typed through the real CLI: one line on stderr naming the problem,
exit 2, no traceback, no process left running, nothing written, and every file of a completed
run byte-identical afterwards. Then the mistakes that can only show at run time: a resume that
fails leaves the completed run's results as they were, a client's error with a colourful
traceback reaches summary.json as one readable line, and a resumed run's progress shows its
earlier rounds as history."""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flwr.app import Context, RecordDict
from flwr.supercore.task_identity import TaskIdentity

from client.app import app as client_app
from pollen.tools.progress import Progress
from server.app import app as server_app
from tests.fakes import FakeGrid, settings_of
from tests.pollen.test_cli_e2e import POLLEN, _processes_under

ROOT = Path(__file__).resolve().parents[2]
SIM = ["simulate", "--dataset", "digits", "--clients", "2", "--rounds", "1"]
CLIENT = ["client", "--superlink", "127.0.0.1:9092", "--num-partitions", "2", "--insecure",
          "--allow-any-app"]  # fmt: skip


def _run_server_app(cfg: dict[str, Any], grid: FakeGrid | None = None) -> None:
    grid = grid or FakeGrid(client_app, 2, cfg)
    server_app(
        grid, Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=dict(cfg))
    )


def _completed(out: Path, cache: Path, **extra: Any) -> dict[str, Any]:
    cfg = settings_of({"dataset": "digits", "num-clients": 2, "min-available-clients": 2,
                       "num-rounds": 1, "batch-size": 16, "lr": 0.1, "poll-interval": 0.01,
                       "phase-timeout": 30.0, "wait-for-clients": 5.0, "cache-dir": str(cache),
                       "out-dir": str(out), "run-name": "done", **extra})  # fmt: skip
    _run_server_app(cfg)
    assert json.loads((out / "summary.json").read_text())["status"] == "completed"
    return cfg


def _digests(directory: Path) -> dict[str, str]:
    return {
        str(p.relative_to(directory)): hashlib.md5(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, shared_cache: Path) -> Iterator[Path]:
    """A completed run, broken copies of it, bad certificates and a read-only mount."""
    tmp = tmp_path_factory.mktemp("operator")
    done = tmp / "done"
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 1  # (module scope)
    _completed(done, shared_cache)
    for name in ("corrupt", "nockpt"):
        shutil.copytree(done, tmp / name)
    state = tmp / "corrupt" / "checkpoint" / "state.npz"
    state.write_bytes(state.read_bytes()[:-40] + b"\0" * 40)
    shutil.rmtree(tmp / "nockpt" / "checkpoint")
    (tmp / "noconfig").mkdir()
    (tmp / "afile").write_text("not a directory\n")
    truncated = tmp / "truncated"
    shutil.copytree(done, truncated)
    with open(truncated / "metrics.jsonl", "a") as fh:
        fh.write('{"round": 2, "train": {"test-acc')
    certs = tmp / "certs"
    subprocess.run(["bash", str(ROOT / "scripts" / "generate-certs.sh"), str(certs)], check=True,
                   capture_output=True)  # fmt: skip
    other = tmp / "other-certs"
    subprocess.run(["bash", str(ROOT / "scripts" / "generate-certs.sh"), str(other)], check=True,
                   capture_output=True)  # fmt: skip
    for name, change in (("junk", {"server.pem": b"junk\n"}),
                         ("wrongkey", {"server.key": (other / "server.key").read_bytes()}),
                         ("wrongca", {"ca.crt": (other / "ca.crt").read_bytes()})):  # fmt: skip
        shutil.copytree(certs, tmp / name)
        for file, data in change.items():
            (tmp / name / file).write_bytes(data)
    (tmp / "empty-certs").mkdir()
    (tmp / "junk.key").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nnot a key\n")
    readonly = tmp / "readonly"
    readonly.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(readonly)],
                             capture_output=True, check=False).returncode == 0  # fmt: skip
    (tmp / ".readonly-mounted").write_text("1" if mounted else "")
    tiny = tmp / "tiny"  # a filesystem with 1 MB: too little for a run
    tiny.mkdir()
    if mounted:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(tiny)],
                       capture_output=True, check=True)  # fmt: skip
    yield tmp
    if mounted:
        for mount in (readonly, tiny):
            subprocess.run(["umount", str(mount)], capture_output=True, check=False)




# (case id, arguments with {w} for the prepared directory, what the one error line says)
CASES: list[tuple[str, list[str], str]] = [
    ("out-is-a-file", [*SIM, "--out", "{w}/afile"], "is a file, not a directory"),
    ("out-under-a-file", [*SIM, "--out", "{w}/afile/run"], "is a file, not a directory"),
    ("out-in-proc", [*SIM, "--out", "/proc/pollen-x"], "cannot be written"),
    ("out-read-only-fs", [*SIM, "--out", "{w}/readonly/run"], "Read-only file system"),
    ("report-out-read-only-fs", ["report", "{w}/done", "--out", "{w}/readonly/report"],
     "cannot write the report"),
    ("report-no-such-dir", ["report", "{w}/nothing-here"], "no such results directory"),
    ("tls-junk-certificate", ["deploy", "--dataset", "digits", "--tls-dir", "{w}/junk"],
     "is not a PEM certificate"),
    ("tls-missing-files", ["deploy", "--dataset", "digits", "--tls-dir", "{w}/empty-certs"],
     "not found"),
    ("tls-key-of-another-cert", ["deploy", "--dataset", "digits", "--tls-dir", "{w}/wrongkey"],
     "is not the key of"),
    ("tls-ca-did-not-sign", ["deploy", "--dataset", "digits", "--tls-dir", "{w}/wrongca"],
     "is not signed by"),
    ("auth-without-tls", ["deploy", "--dataset", "digits", "--auth"], "needs TLS"),
    ("download-unknown-dataset", ["data", "download", "imagenet", "--data-dir", "{w}/data"],
     "unknown dataset 'imagenet'"),
    ("device-cuda-without-gpu", [*SIM, "--set", "device=cuda"], "torch sees no CUDA GPU"),
    ("gpus-per-client-without-gpu", [*SIM, "--gpus-per-client", "0.5"], "torch sees no CUDA GPU"),
    ("deploy-gpus-without-gpu", ["deploy", "--dataset", "digits", "--clients", "2", "--gpus", "0"],
     "torch sees no CUDA GPU"),
    ("client-gpu-without-gpu", [*CLIENT, "--partition-id", "0", "--gpu", "0"],
     "torch sees no CUDA GPU"),
    ("ray-address-not-host-port", [*SIM, "--ray-address", "head-node"], "is not HOST:PORT"),
    ("amp-refused", [*SIM, "--algorithm", "fedlrt", "--set", "amp=true"],
     "amp=true: fedlrt trains in float32 only"),
    ("dp-refused", [*SIM, "--algorithm", "fedlrt", "--set", "dp.noise-multiplier=1"],
     "fedlrt has no DP-SGD training"),
    ("dp-with-amp", [*SIM, "--set", "dp.noise-multiplier=1", "--set", "amp=true"],
     "amp=true with DP-SGD: refused"),
    ("dp-with-local-steps", [*SIM, "--set", "dp.noise-multiplier=1", "--set", "local-steps=20"],
     "local-steps=20 with DP-SGD: refused"),
    ("local-steps-refused", [*SIM, "--algorithm", "fedsc", "--set", "local-steps=20"],
     "local-steps=20: fedsc counts its local work in local-epochs only"),
    ("resume-corrupt-checkpoint", ["simulate", "--out", "{w}/corrupt", "--resume"],
     "checkpoint"),
    ("resume-changed-setting", ["simulate", "--out", "{w}/done", "--resume", "--set", "lr=0.2"],
     "settings differ from the checkpoint (lr: 0.1 -> 0.2)"),
    ("resume-without-checkpoint", ["simulate", "--out", "{w}/nockpt", "--resume"],
     "no checkpoint"),
    ("resume-without-out", ["simulate", "--resume"], "--resume needs --out"),
    ("resume-nothing-there", ["simulate", "--out", "{w}/noconfig", "--resume"],
     "nothing to resume"),
    ("new-run-over-a-run", [*SIM, "--out", "{w}/done"], "already holds a run"),
    ("parallel-zero", [*SIM, "--parallel", "0"], "--parallel"),
    ("parallel-negative", [*SIM, "--parallel", "-3"], "must be 1 or more"),
    ("nodes-zero", [*SIM, "--nodes", "0"], "must number from 1 to the run's 2 clients"),
    ("nodes-above-the-clients", [*SIM, "--nodes", "3"], "--nodes 3: the simulated SuperNodes"),
    ("nodes-and-set-disagree", [*SIM, "--nodes", "1", "--set", "simulation-nodes=2"],
     "--nodes 1 and --set simulation-nodes=2 disagree"),
    ("deploy-packed", ["deploy", "--dataset", "digits", "--clients", "2", "--set",
                       "simulation-nodes=1"], "a deployed SuperNode serves one client"),
    ("setting-of-another-algorithm", [*SIM, "--algorithm", "fedavg", "--set", "fedprox.mu=0.5"],
     "'fedprox.mu' is not read by fedavg; it belongs to fedprox"),
    ("flag-and-set-disagree", [*SIM, "--set", "num-rounds=5"], "--rounds 1 and --set"),
    ("unknown-setting", [*SIM, "--set", "fedem.component=3"], "did you mean fedem.components"),
    ("unknown-algorithm", [*SIM, "--algorithm", "fedme"], "did you mean fedem"),
    ("value-of-the-wrong-type", [*SIM, "--set", "lr=fast"], "expected float"),
    ("value-below-its-minimum", [*SIM, "--set", "lr=-1"], "below the minimum"),
    ("assignment-without-value", [*SIM, "--set", "lr"], "expected key=value"),
    ("unknown-dataset", ["simulate", "--dataset", "mnsit"], "dataset"),
    ("impossible-partition", [*SIM, "--set", "partitioner=classes",
                              "--set", "classes-per-client=11"],
     "classes_per_client must be in [1, 10]"),
    ("more-replies-than-clients", [*SIM, "--set", "min-replies=5"], "exceeds num-clients"),
    ("server-without-tls-or-insecure", ["server"], "no TLS material"),
    ("server-api-on-all-interfaces", ["server", "--insecure", "--api-host", "0.0.0.0"],
     "--expose-api"),
    ("server-secret-without-process-isolation",
     ["server", "--insecure", "--superexec-auth-secret-file", "{w}/afile"], "--isolation"),
    ("client-address-without-port", ["client", "--superlink", "server.example.org",
                                     "--partition-id", "0", "--num-partitions", "2",
                                     "--insecure", "--allow-any-app"], "is not HOST:PORT"),
    ("client-partition-out-of-range", [*CLIENT, "--partition-id", "2"], "is not one of the 2"),
    ("client-without-trust", ["client", "--superlink", "h:1", "--partition-id", "0",
                              "--num-partitions", "2", "--insecure"], "no --trusted-key"),
    ("client-trusted-key-missing", [*CLIENT[:-1], "--partition-id", "0", "--trusted-key",
                                    "{w}/nothing.pub"], "cannot be read"),
    ("run-signing-key-junk", ["run", "--superlink", "127.0.0.1:9", "--dataset", "digits",
                              "--signing-key", "{w}/junk.key"], "is not a private key"),
    ("run-address-without-port", ["run", "--superlink", "localhost", "--dataset", "digits"],
     "is not HOST:PORT"),
    ("server-port-not-a-number", ["server", "--insecure", "--port", "web"],
     "'web' is not a port number (1 to 65535)"),
    ("server-port-out-of-range", ["server", "--insecure", "--fleet-port", "70000"],
     "70000 is not a port number (1 to 65535)"),
    ("server-ports-the-same", ["server", "--insecure", "--port", "9092"],
     "--port and --fleet-port are both 9092"),
    ("server-fleet-port-taken", ["server", "--insecure", "--port", "{free}", "--fleet-port",
                                 "{taken}"], "is already in use by another program"),
    ("server-api-port-taken", ["server", "--insecure", "--port", "{taken}", "--fleet-port",
                               "{free}"], "is already in use by another program"),
    ("server-fleet-host-elsewhere", ["server", "--insecure", "--port", "{free}", "--fleet-host",
                                     "192.0.2.1"], "192.0.2.1 is not an address of this machine"),
    ("server-database-directory-missing", ["server", "--insecure", "--database",
                                           "/some/missing/dir/superlink.db"],
     "the directory /some/missing/dir does not exist"),
    ("server-database-is-a-directory", ["server", "--insecure", "--database", "{w}"],
     "is a directory; give the database file's path"),
    ("server-database-not-sqlite", ["server", "--insecure", "--database", "{w}/afile"],
     "is not an SQLite database"),
    ("client-state-dir-in-proc", [*CLIENT, "--partition-id", "0", "--state-dir",
                                  "/proc/pollen-x"],
     "--state-dir /proc/pollen-x cannot be written"),
    ("client-state-dir-a-file", [*CLIENT, "--partition-id", "0", "--state-dir", "{w}/afile"],
     "is a file, not a directory"),
    ("client-data-dir-a-file", [*CLIENT, "--partition-id", "0", "--data-dir", "{w}/afile"],
     "is a file, not a directory"),
    ("client-data-dir-missing", [*CLIENT, "--partition-id", "0", "--data-dir",
                                 "{w}/nothing-here"], "does not exist"),
    ("client-port-taken", [*CLIENT, "--partition-id", "0", "--port", "{taken}"],
     "is already in use by another program"),
    ("client-root-certificates-junk", [*CLIENT[:-2], "--allow-any-app", "--partition-id", "0",
                                       "--root-certificates", "{w}/afile"],
     "is not a PEM certificate"),
    ("client-auth-key-junk", [*CLIENT[:-2], "--allow-any-app", "--partition-id", "0",
                              "--root-certificates", "{w}/certs/ca.crt", "--auth-key",
                              "{w}/junk.key"], "is not a private key"),
    ("client-peer-keys-junk", [*CLIENT[:-2], "--allow-any-app", "--partition-id", "0",
                               "--root-certificates", "{w}/certs/ca.crt", "--peer-keys",
                               "{w}/empty-certs"], "no *.pub file in it"),
    ("out-no-space", [*SIM, "--out", "{w}/tiny/run"], "no space left on device"),
    ("start-timeout-not-positive", [*SIM, "--start-timeout", "0"],
     "'0' is not a positive number of seconds"),
    ("settings-of-an-unknown-algorithm", ["settings", "fedme"], "did you mean fedem"),
    ("experiment-file-missing", ["experiment", "{w}/nothing.toml"], "nothing.toml"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "says"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_mistake_is_one_line_before_anything_starts(
    world: Path, shared_cache: Path, taken_port: int, args: list[str], says: str
) -> None:
    mounts = ("{w}/readonly", "{w}/tiny")
    if any(m in " ".join(args) for m in mounts) and not (world / ".readonly-mounted").read_text():
        pytest.skip("mounting a tmpfs is not permitted here")
    if "no CUDA GPU" in says:
        import torch  # lazy: only these cases

        if torch.cuda.is_available():
            pytest.skip("this machine has a CUDA GPU")
    before = _digests(world / "done")
    from pollen.tools.processes import free_port

    argv = [a.replace("{w}", str(world)).replace("{taken}", str(taken_port))
            .replace("{free}", str(free_port())) for a in args]  # fmt: skip
    cwd = world / "cwd"  # a default results/ directory would land here
    cwd.mkdir(exist_ok=True)
    env = dict(os.environ, POLLEN_CACHE_DIR=str(shared_cache), FLWR_TELEMETRY_ENABLED="0",
               FLWR_HOME=str(world / "home"))  # fmt: skip
    done = subprocess.run([*POLLEN, *argv], capture_output=True, text=True, timeout=120, cwd=cwd,
                          env=env)  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    warnings = [line for line in lines if line.startswith("pollen: warning:")]
    errors = [line for line in lines if line not in warnings]
    assert len(errors) == 1 and errors[0].startswith("pollen: error: "), done.stderr
    assert says in errors[0], errors[0]
    assert "Traceback" not in done.stdout + done.stderr
    assert _processes_under(world) == []
    assert _digests(world / "done") == before  # the completed run, byte for byte
    assert list(cwd.iterdir()) == []  # nothing written
    assert not (world / "readonly" / "run").exists()
    assert not (world / "tiny" / "run").exists()


def test_resuming_a_run_that_completed_every_round_changes_nothing(
    world: Path, shared_cache: Path
) -> None:
    """`--resume` of a completed run without more rounds: one line, exit 0, nothing started, and
    the run's files byte-identical. Before, it ran the final evaluation again and rewrote
    summary.json without the last round's metrics or the run's time."""
    before = _digests(world / "done")
    env = dict(os.environ, POLLEN_CACHE_DIR=str(shared_cache), FLWR_TELEMETRY_ENABLED="0",
               FLWR_HOME=str(world / "home"))  # fmt: skip
    done = subprocess.run([*POLLEN, "simulate", "--out", str(world / "done"), "--resume"],
                          capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        f"pollen: the run in {world / 'done'} already completed its 1 rounds; nothing to resume "
        "(to train further, resume it with --rounds above 1)"
    ]
    assert done.stderr == ""
    assert _processes_under(world) == []
    assert _digests(world / "done") == before


def test_the_case_table_is_the_size_the_reliability_page_gives() -> None:
    assert len(CASES) >= 33
    table = (ROOT / "docs" / "reliability.md").read_text()
    for name, _, _ in CASES:
        assert f"`{name}`" in table, name


def test_a_report_reads_a_metrics_file_cut_off_mid_write(world: Path, tmp_path: Path) -> None:
    done = subprocess.run([*POLLEN, "report", str(world / "truncated"), "--out",
                           str(tmp_path / "report")], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    [warning] = [line for line in done.stderr.splitlines() if line.strip()]
    assert "is incomplete (cut off mid-write); reporting the 1 complete lines" in warning
    assert (tmp_path / "report" / "report.md").exists()


def test_a_failed_resume_leaves_the_completed_run_as_it_was(
    tmp_path: Path, shared_cache: Path
) -> None:
    """Resuming a completed run for more rounds, when no client answers: the run fails, and
    summary.json, metrics.jsonl, the final model and config.json stay byte-identical; the
    failure is recorded beside them."""
    out = tmp_path / "run"
    cfg = _completed(out, shared_cache)
    before = _digests(out)
    resumed = settings_of({**cfg, "num-rounds": 2, "resume": True, "wait-for-clients": 0.2})
    with pytest.raises(RuntimeError):
        _run_server_app(resumed, FakeGrid(client_app, 0, resumed))  # nobody connects
    after = _digests(out)
    for name in ("summary.json", "metrics.jsonl", "final_model.npz", "config.json",
                 "clients.jsonl"):  # fmt: skip
        assert after[name] == before[name], name
    failure = json.loads((out / "resume-failed.json").read_text())
    assert failure["status"] == "failed" and "clients" in failure["reason"]
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    assert events[-1]["event"] == "resume-failed"


def test_a_clients_colourful_traceback_is_one_readable_line(
    tmp_path: Path, shared_cache: Path
) -> None:
    """Every client fails (as a CUDA error inside Ray would): summary.json's reason is one line
    without terminal codes that names the exception and the log with the full text."""
    out = tmp_path / "run"
    cfg = settings_of({"dataset": "digits", "num-clients": 2, "min-available-clients": 2,
                       "num-rounds": 1, "poll-interval": 0.01, "phase-timeout": 30.0,
                       "cache-dir": str(shared_cache), "out-dir": str(out),
                       "run-name": "x"})  # fmt: skip
    grid = FakeGrid(client_app, 2, cfg)
    grid.errors_as_replies = True
    trace = ("\x1b[36m(ClientAppActor pid=1)\x1b[0m Traceback (most recent call last):\n"
             '  File "client/fedavg.py", line 3, in train\n'
             "    model.to(device)\n"
             "torch.AcceleratorError: \x1b[31mCUDA error: no kernel image is available"
             "\x1b[0m")  # fmt: skip

    def cuda_failure(node: int, msg: Any, content: Any) -> Any:
        return "error" if msg.metadata.message_type == "train" else None

    grid.faults.append(cuda_failure)
    grid.error_reason = trace
    with pytest.raises(RuntimeError):
        _run_server_app(cfg, grid)
    summary = json.loads((out / "summary.json").read_text())
    reason = summary["reason"]
    assert "\n" not in reason and "\x1b" not in reason and "Traceback" not in reason
    assert "CUDA error: no kernel image is available" in reason
    assert summary["log"] == str(out / "server.log")


def test_a_resumed_runs_earlier_rounds_are_history_not_progress(tmp_path: Path) -> None:
    out = tmp_path
    (out / "metrics.jsonl").write_text(
        "".join(json.dumps({"round": r, "train": {}, "seconds": 1.0}) + "\n" for r in (1, 2))
    )
    (out / "events.jsonl").write_text(
        json.dumps({"event": "phase-start", "round": 1, "phase": "train", "clients": 2}) + "\n"
    )
    shown = io.StringIO()
    progress = Progress(out, shown, num_rounds=3, history=True)
    progress.poll()
    with open(out / "events.jsonl", "a") as fh:
        fh.write(json.dumps({"event": "phase-start", "round": 3, "phase": "train",
                             "clients": 2}) + "\n")  # fmt: skip
        fh.write(json.dumps({"event": "phase-end", "round": 3, "phase": "train", "sent": 2,
                             "valid": 2, "seconds": 1.5, "failed": {}}) + "\n")  # fmt: skip
    progress.poll()
    text = shown.getvalue()
    assert "resuming: 2 rounds done before" in text
    assert "round 1" not in text and "round 2" not in text
    assert "round 3/3 train: 2/2 valid replies in 1.5 s" in text
    assert progress.state.done == 2  # the bar of the live view starts at 2 of 3


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found[name] = sub
                found.update(_subparsers(sub))
    return found


def test_every_command_help_shows_defaults_and_an_example() -> None:
    from pollen.tools.cli.parser import EXAMPLES, build_parser

    commands = _subparsers(build_parser())
    assert set(commands) == set(EXAMPLES)
    for name, sub in commands.items():
        text = sub.format_help()
        assert f"example:\n  {EXAMPLES[name]}" in text, name
    assert "(default: 600.0)" in commands["client"].format_help()
    assert "(default: 9093)" in commands["server"].format_help()
    assert "(default: 2)" in commands["simulate"].format_help()


def test_settings_of_one_algorithm_are_its_own_and_the_common_ones(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from pollen.tools.cli import main

    assert main(["settings", "d-fedem"]) == 0
    keys = {line.split()[0] for line in capsys.readouterr().out.splitlines()}
    assert {"lr", "fedem.components", "d-fedem.edge-probability"} <= keys
    assert not any(k.startswith(("fedsc.", "fedprox.", "adept")) for k in keys)
