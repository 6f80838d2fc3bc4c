"""Buffered asynchronous aggregation (server.buffered, FedBuff) in process on a fake grid:
with buffer = concurrency = every client and no devices it is synchronous FedAvg; on the
virtual clock with scripted device times the staleness of every reply and the staleness bound
are as specified, and a version takes one reply of each client; FedEM runs, with client-level
DP noised on the server too; a failing client cannot hold a version forever; resume goes on
from the checkpoint's version and time."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pollen.core.rundir import read_jsonl
from server.engine import PhaseFailed
from tests.server.test_pacing import _rows, _run, _settings


def _clients(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    return read_jsonl(Path(cfg["out-dir"]) / "clients.jsonl")


def test_one_buffer_of_every_client_is_synchronous_fedavg(run_config: dict[str, Any]) -> None:
    sync = _settings(run_config, "sync", **{"num-rounds": 3, "final-eval": True})
    buffered = _settings(run_config, "fedbuff", **{
        "num-rounds": 3, "async.buffer": 6, "async.concurrency": 6, "final-eval": True,
    })  # fmt: skip
    a, summary_a = _run(sync)
    b, summary_b = _run(buffered)
    assert summary_a["status"] == summary_b["status"] == "completed"
    for key, value in a.strategy.state()[0].items():
        np.testing.assert_allclose(b.strategy.state()[0][key], value, rtol=1e-5, atol=1e-6)
    for row in _rows(buffered):
        (train,) = row["phases"]
        assert train["sent"] == 6 and train["valid"] == 6 and train["late"] == []
    trained = [r for r in _clients(buffered) if r["phase"] == "train"]
    assert len(trained) == 18 and all(r["metrics"]["staleness"] == 0 for r in trained)
    final_a, final_b = summary_a["final"]["eval"], summary_b["final"]["eval"]
    assert final_b["test-accuracy"] == pytest.approx(final_a["test-accuracy"], abs=1e-9)


def _devices(
    run_config: dict[str, Any], tmp_path: Path, tag: str, seconds: list[float], **extra: Any
) -> dict[str, Any]:
    """A client per entry of `seconds`, its device answering in that many virtual seconds
    (its latency, nothing else)."""
    csv = tmp_path / f"{tag}.csv"
    rows = "".join(f"0,1e9,{500 * s:g}\n" for s in seconds)
    csv.write_text("example-ms,bandwidth-mbps,latency-ms\n" + rows)
    return _settings(run_config, tag, **{
        "num-clients": len(seconds), "heterogeneity.profile": str(csv),
        "heterogeneity.clock": "virtual", **extra,
    })  # fmt: skip


def _scripted(run_config: dict[str, Any], tmp_path: Path, tag: str, **extra: Any) -> dict[str, Any]:
    """Three devices answering in 1, 10 and 1 virtual seconds."""
    return _devices(run_config, tmp_path, tag, [1, 10, 1], **{
        "num-rounds": 24, "async.buffer": 1, "async.concurrency": 3, "async.max-staleness": 1,
        **extra,
    })  # fmt: skip


def test_scripted_delays_give_the_staleness_and_the_bound(
    run_config: dict[str, Any], tmp_path: Path
) -> None:
    cfg = _scripted(run_config, tmp_path, "scripted")
    _, summary = _run(cfg)
    assert summary["status"] == "completed"
    # all three start on round 1's model at 0 s; clients 0 and 2 answer in 1 s, 1 in 10 s.
    # Round 1 takes client 0 (1 s; a tie: the lower id first), which is then sent round 2's
    # model (it answers at 2 s); round 2 takes client 2 (round 1's model: 1 version old),
    # then sent round 3's (2 s); so on, two versions a second, each reply one version old,
    # until client 1 comes at 10 s with round 1's model: dropped as stale
    rows = _rows(cfg)
    taken = [(r["round"], r["client-id"], r["metrics"]["staleness"]) for r in _clients(cfg)
             if r["phase"] == "train"]  # fmt: skip
    assert taken[:4] == [(1, 0, 0), (2, 2, 1), (3, 0, 1), (4, 2, 1)]
    assert all(s <= 1 for _, _, s in taken) and 1 not in {c for _, c, _ in taken}
    assert [r["time"] for r in rows][:4] == pytest.approx([1.0, 1.0, 2.0, 2.0])
    stale = [(r["round"], r["phases"][0]["failed"]) for r in rows if r["phases"][0]["late"]]
    assert len(stale) == 1
    rnd, failed = stale[0]
    assert rows[rnd - 1]["time"] >= 10.0 > rows[rnd - 3]["time"]
    assert failed["1"] == (
        f"stale: trained on round 1's model, {rnd - 1} versions old (async.max-staleness 1)"
    )


def test_a_version_takes_one_reply_of_each_client(
    run_config: dict[str, Any], tmp_path: Path
) -> None:
    # devices answering in 2, 2 and 1 virtual seconds, two replies a version, all three busy:
    # client 2's reply on round 3's model comes at 4 s into round 4's buffer (one version
    # old); handed round 4's model then, it would answer at 5 s, before either other client,
    # and fill that buffer a second time. It waits for the version instead.
    cfg = _devices(run_config, tmp_path, "one-each", [2, 2, 1], **{
        "num-rounds": 10, "async.buffer": 2, "async.concurrency": 3,
    })  # fmt: skip
    _, summary = _run(cfg)
    assert summary["status"] == "completed"
    by_round: dict[int, list[int]] = {}
    for r in _clients(cfg):
        if r["phase"] == "train":
            by_round.setdefault(r["round"], []).append(r["client-id"])
    assert sorted(by_round) == list(range(1, 11))
    assert all(len(set(cids)) == len(cids) == 2 for cids in by_round.values()), by_round


def test_a_client_waiting_for_its_version_frees_its_place(
    run_config: dict[str, Any], tmp_path: Path
) -> None:
    # four devices of 1 s, two replies a version, two training: the first reply's client
    # waits for the version, and a free client is sent in its place at once
    cfg = _devices(run_config, tmp_path, "refill", [1, 1, 1, 1], **{
        "num-rounds": 3, "async.buffer": 2, "async.concurrency": 2,
    })  # fmt: skip
    _, summary = _run(cfg)
    assert summary["status"] == "completed"
    assert _rows(cfg)[0]["phases"][0]["sent"] == 3


def test_fedem_runs_buffered(run_config: dict[str, Any]) -> None:
    cfg = _settings(run_config, "fedem-buffered", **{
        "algorithm": "fedem", "fedem.components": 2, "num-rounds": 3, "async.buffer": 2,
        "async.concurrency": 4, "final-eval": True,
    })  # fmt: skip
    _, summary = _run(cfg)
    assert summary["status"] == "completed"
    rows = _rows(cfg)
    assert [r["phases"][0]["valid"] for r in rows] == [2, 2, 2]
    assert summary["final"]["eval"]["test-accuracy"] > 0.2


def test_fedem_buffered_with_client_dp_noised_on_the_server(run_config: dict[str, Any]) -> None:
    from models.privacy import epsilon

    cfg = _settings(run_config, "fedem-buffered-dp", **{
        "algorithm": "fedem", "fedem.components": 2, "num-rounds": 3, "async.buffer": 2,
        "async.concurrency": 4, "client-dp.noise-multiplier": 2.0, "client-dp.clip": 1.0,
    })  # fmt: skip
    _, summary = _run(cfg)
    assert summary["status"] == "completed"
    rows = _rows(cfg)
    # one release a version, however many clients were sent: z / 2 at rate 1
    spent = [r["train"]["client-epsilon"] for r in rows]
    assert spent == pytest.approx([epsilon([(1.0, 1.0, v)], 1e-5) for v in (1, 2, 3)])
    # the M components of a client clipped together, the noise over K = 2
    assert all(r["train"]["client-dp-noise-std"] == pytest.approx(1.0) for r in rows)
    level = summary["privacy"]["client-level"]
    assert level["accounted-rate"] == 1.0 and "FedBuff" in level["sensitivity"]


def test_a_client_that_always_fails_cannot_hold_a_version(run_config: dict[str, Any]) -> None:
    cfg = _settings(run_config, "failing", **{"async.buffer": 2, "async.concurrency": 2})
    with pytest.raises(PhaseFailed, match="buffered phase train"):
        _run(cfg, lambda _node, msg: "error" if msg.metadata.message_type == "train" else None)
    summary = json.loads((Path(cfg["out-dir"]) / "summary.json").read_text())
    assert summary["status"] == "failed"


def test_a_resumed_buffered_run_goes_on_from_its_version_and_time(
    run_config: dict[str, Any], tmp_path: Path
) -> None:
    cfg = _scripted(run_config, tmp_path, "resumed", **{"num-rounds": 3})
    _run(cfg)
    _, summary = _run({**cfg, "num-rounds": 5, "resume": True})
    assert summary["status"] == "completed"
    rows = _rows(cfg)
    assert [r["round"] for r in rows] == [1, 2, 3, 4, 5]
    times = [r["time"] for r in rows]
    assert times == sorted(times) and times[3] >= times[2]
