"""The benchmark suite's own pieces keep working as the code they call changes."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_flower_fedavg_client_trains_and_evaluates(run_config: dict[str, Any]) -> None:
    """Flower's-FedAvg comparison app: the train reply has Flower's FedAvg layout (an Array per
    tensor + metrics with num-examples) and moves the weights; evaluate reports test accuracy."""
    from strategies.classifier import initial_weights

    app = _load("flower_fedavg_app")
    node: dict[str, bool | float | int | str] = {"partition-id": 0, "num-partitions": 3}
    ctx = Context(run_id=1, node_id=1, node_config=node, state=RecordDict(), run_config=run_config)
    start = initial_weights(run_config, 0)
    content = RecordDict(
        {
            "arrays": app._record(start),
            "config": ConfigRecord({"lr": 0.1, "server-round": 1}),
        }
    )
    reply = app.client(Message(content, dst_node_id=1, message_type="train"), ctx).content
    trained = {k: reply["arrays"][k].numpy() for k in reply["arrays"]}
    assert trained.keys() == start.keys()
    assert any((trained[k] != start[k]).any() for k in start)
    assert reply["metrics"]["num-examples"] > 0
    evaluated = app.client(Message(content, dst_node_id=1, message_type="evaluate"), ctx).content
    assert 0.0 <= evaluated["metrics"]["test-accuracy"] <= 1.0


def test_fedlrt_scaling_saves_more_as_the_layer_grows() -> None:
    rows = _load("fedlrt_scaling").measure([(64, 4), (256, 8)], repeats=1)
    assert rows[0]["bytes-ratio"] < 1 and rows[1]["bytes-ratio"] < rows[0]["bytes-ratio"]


def test_deploy_targets_compare_with_flower_and_the_floor(monkeypatch: Any) -> None:
    """The figures the resident worker's targets are read from: Pollen's round against Flower's
    (ratio <= 0.45) and against the no-op round + 1.3 x the clients' handler time."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # run.py imports its sibling scripts
    run = _load("run")
    ours = {"round-seconds": 5.0, "client": {"time-handler": {"median": 0.5}}}
    floor = {"round-seconds": 4.5}
    met = run._deploy_targets(ours, {"round-seconds": 12.0}, floor)
    assert met["ratio-to-flower"] == round(5.0 / 12.0, 3) and met["ratio-met"]
    assert met["noop-plus-1.3-handler"] == 5.15 and met["floor-bound-met"]
    missed = run._deploy_targets({**ours, "round-seconds": 6.0}, {"round-seconds": 12.0}, floor)
    assert not missed["ratio-met"] and not missed["floor-bound-met"]
    assert run._deploy_targets({"error": "x"}, {"round-seconds": 12.0}, floor) == {}


def test_tree_memory_by_role_and_the_lost_messages_of_a_run(
    monkeypatch: Any, tmp_path: Path
) -> None:
    """The nodes part's figures: a process tree's memory by role (a child that holds 64 MB of
    its own shows up under its role and in the proportional total), and the resends and lost
    messages read back from a deployed run's directory."""
    import json
    import subprocess

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    run = _load("run")
    hold = "import time; b = bytearray(64 << 20); b[::4096] = b'x' * len(b[::4096]); time.sleep(3)"
    child = subprocess.Popen([sys.executable, "-c", hold, "client.worker"])
    with run.TreeMemory(child.pid, every=0.1, roles=True) as memory:
        child.wait(timeout=30)
    assert memory.by_role["worker"]["n"] == 1 and memory.by_role["worker"]["max-mb"] >= 64
    assert memory.peak_pss_mb is not None and memory.peak_pss_mb >= 64
    assert memory.peak_mb is not None and memory.peak_mb >= memory.peak_pss_mb

    procs = tmp_path / "processes"
    procs.mkdir()
    (procs / "superlink.log").write_text("x database is locked\ny database is locked\n")
    (procs / "supernode-3.log").write_text("Failed to send message m: Internal server error\n")
    events = [{"event": "resend", "nodes": [1, 2]}, {"event": "phase-end"}]
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    assert run._lost_and_resent(tmp_path) == {
        "resent": 2, "database-locked": 2, "failed-sends": 1,
    }  # fmt: skip


def test_gpu_use_keeps_the_warm_rounds_samples(monkeypatch: Any, tmp_path: Path) -> None:
    """The loop part's GPU utilisation: each nvidia-smi sample is tagged with the rounds the
    run's metrics.jsonl holds when it arrives, and the summary keeps rounds 2..3 of 3 only;
    without nvidia-smi the summary says so instead of a figure."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    run = _load("run")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text(
        "#!/bin/bash\n"
        "for k in 0 1 2 3; do\n"
        f"  while [ ! -e {tmp_path}/go$k ]; do sleep 0.02; done\n"
        '  echo "$((k * 20 + 10)), $((1000 + k))"\n'
        "done\n"
        "exec sleep 60\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    metrics = tmp_path / "metrics.jsonl"
    with run.GpuUse(tmp_path, 3) as use:
        for done in range(4):
            metrics.write_text("{}\n" * done)
            (tmp_path / f"go{done}").touch()
            for _ in range(500):
                if len(use.samples) > done:
                    break
                time.sleep(0.02)
    assert use.samples == [(k, 20.0 * k + 10, 1000.0 + k) for k in range(4)]
    assert use.summary() == {
        "warm-samples": 2, "mean-utilisation-percent": 40.0, "max-utilisation-percent": 50.0,
        "busy-share": 1.0, "peak-memory-mib": 1003.0,
    }  # fmt: skip
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    with run.GpuUse(tmp_path, 3) as missing:
        pass
    assert "nvidia-smi" in missing.summary()["error"]
    with run.GpuUse(tmp_path, 3, active=False) as off:
        pass
    assert off.summary() == {"error": "no samples from nvidia-smi"}


@pytest.mark.slow
def test_the_loop_floor_trains_and_averages_the_clients_models(shared_cache: Path) -> None:
    """benchmarks/loop_floor.py, the floor `--parts loop` compares Pollen with: its rounds are
    timed, and a round is the examples-weighted mean of the clients' trained models (with lr 0
    every client returns the global model, so the mean is that model; with lr > 0 it moves)."""
    import torch

    from models import build_model
    from pollen.core.runconfig import resolve
    from pollen.core.settings import RunSettings

    loop = _load("loop_floor")
    result = loop.measure(3, 2, shared_cache, dataset="digits")
    assert len(result["round-seconds-each"]) == 2 and result["round-seconds"] > 0
    assert result["examples"] > 0
    x = torch.rand(20, 1, 8, 8)
    y = torch.randint(0, 10, (20,))
    data = [(x[:12], y[:12]), (x[12:], y[12:])]
    torch.manual_seed(0)
    state = build_model("mlp", (1, 8, 8), 10).state_dict()
    for lr, moves in ((0.0, False), (0.5, True)):
        run = RunSettings.of(resolve({"dataset": "digits", "lr": lr, "batch-size": 4}))
        after = loop._round(state, data, run, (1, 8, 8), 10, 0, torch.device("cpu"))
        changed = any(not torch.allclose(after[k], state[k]) for k in state)
        assert changed == moves, lr
