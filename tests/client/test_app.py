"""The ClientApp's routing and the node-configuration checks, called as Flower calls them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from flwr.app import Context, Message, RecordDict

from client.app import app
from client.env import ClientConfigError, ClientEnv
from pollen.core import protocol


def _context(cfg: dict[str, Any], **node: Any) -> Context:
    return Context(run_id=7, node_id=1, node_config=node, state=RecordDict(), run_config=dict(cfg))


def _send(message_type: str, ctx: Context, **arrays: Any) -> Message:
    content = protocol.instruction(1, message_type, **arrays)
    return app(Message(content, dst_node_id=1, message_type=message_type), ctx)


def test_hello_reports_identity_and_split_sizes(run_config: dict[str, Any]) -> None:
    reply = _send("query.hello", _context(run_config, **{"partition-id": 2, "num-partitions": 3}))
    env: Any = reply.content[protocol.ENVELOPE]
    metrics: Any = protocol.metrics_of(reply.content)
    assert env["client-id"] == 2 and env["message-type"] == "query.hello"
    total = metrics["num-examples"] + metrics["val-examples"] + metrics["test-examples"]
    assert 550 < total < 650  # a third of the 1,797 digits


@pytest.mark.parametrize(
    ("node", "message"),
    [
        ({}, "no partition-id"),
        ({"partition-id": 3}, "outside"),
        ({"partition-id": 0, "num-partitions": 5}, "num-partitions=5"),
    ],
)
def test_node_config_must_fit_the_run(
    run_config: dict[str, Any], node: dict[str, Any], message: str
) -> None:
    with pytest.raises(ClientConfigError, match=message):
        ClientEnv.from_context(_context(run_config, **node))


def test_state_and_cache_directories_follow_the_node_config(
    run_config: dict[str, Any], tmp_path: Path
) -> None:
    env = ClientEnv.from_context(
        _context(
            run_config,
            **{
                "partition-id": 1,
                "state-dir": str(tmp_path / "s"),
                "cache-dir": str(tmp_path / "c"),
            },
        )
    )
    assert env.state.dir == tmp_path / "s" / "test" / "client-1"
    assert env.cache_dir == tmp_path / "c"
    plain = ClientEnv.from_context(_context({**run_config, "run-name": ""}, **{"partition-id": 1}))
    assert plain.state.dir == Path(run_config["out-dir"]) / "client-state" / "run-7" / "client-1"


def test_seeds_differ_by_client_round_and_purpose(run_config: dict[str, Any]) -> None:
    a = ClientEnv.from_context(_context(run_config, **{"partition-id": 0}))
    b = ClientEnv.from_context(_context(run_config, **{"partition-id": 1}))
    seeds = {a.seed(1, "train"), a.seed(2, "train"), a.seed(1, "init"), b.seed(1, "train")}
    assert len(seeds) == 4 and a.seed(1, "train") == a.seed(1, "train")


def test_unknown_message_type_for_the_algorithm_is_an_error(run_config: dict[str, Any]) -> None:
    ctx = _context({**run_config, "algorithm": "local"}, **{"partition-id": 0})
    with pytest.raises(KeyError, match=r"no client handler for 'query\.noop'"):
        _send("query.noop", ctx)


def test_client_timing_adds_where_the_time_went(run_config: dict[str, Any]) -> None:
    from strategies.classifier import initial_weights

    node = {"partition-id": 0, "num-partitions": 3}
    weights = initial_weights(run_config, 0)
    plain: Any = protocol.metrics_of(
        _send("train", _context(run_config, **node), arrays=weights).content
    )
    assert not any(k.startswith("time-") for k in plain)
    timed_cfg = {**run_config, "client-timing": True}
    timed: Any = protocol.metrics_of(
        _send("train", _context(timed_cfg, **node), arrays=weights).content
    )
    assert timed["time-handler"] >= timed["time-data"] > 0
    # the handler decoded the weights and encoded its reply; Flower's object serialization of
    # the reply and the incoming message (which carry the weights) is timed apart
    assert timed["time-handler"] > timed["time-codec"] > 0
    assert timed["time-serialize"] > 0 and timed["time-deserialize"] > 0
    assert timed["peak-rss-mb"] > 0
    assert {k: v for k, v in timed.items() if not k.startswith(("time-", "peak-"))} == dict(plain)
