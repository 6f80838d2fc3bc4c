from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Message, RecordDict

from pollen.core import protocol
from strategies.aggregate import aggregate_metrics, expect_arrays, weighted_average
from strategies.base import InvalidReply


def test_weighted_average_matches_the_definition() -> None:
    rng = np.random.default_rng(0)
    models: list[dict[str, np.ndarray]] = [
        {"a": rng.standard_normal((3, 4)).astype(np.float32), "n": np.array(k, dtype=np.int64)}
        for k in range(3)
    ]
    weights = [1.0, 2.0, 5.0]
    out = weighted_average(models, weights)
    expected = (
        sum(w * m["a"].astype(np.float64) for w, m in zip(weights, models, strict=False)) / 8.0
    )
    np.testing.assert_allclose(out["a"], expected, rtol=1e-6)
    assert out["a"].dtype == np.float32 and out["n"].dtype == np.int64


@pytest.mark.parametrize("weights", [[0.0, 0.0], [1.0, -1.0], [np.nan, 1.0], [1.0]])
def test_weighted_average_rejects_bad_weights(weights: list[float]) -> None:
    models = [{"a": np.zeros(2)}, {"a": np.ones(2)}]
    with pytest.raises(ValueError, match="weights"):
        weighted_average(models, weights)


def _reply(metrics: dict, **arrays: dict) -> RecordDict:
    return protocol.reply(protocol.instruction(1, "train"), 0, metrics, **arrays)


def test_expect_arrays_checks_keys_shapes_dtypes() -> None:
    ref = {"w": np.zeros((2, 2), np.float32)}
    assert expect_arrays(_reply({}, arrays=ref), "arrays", ref)["w"].shape == (2, 2)
    for bad, message in (
        ({"w": np.zeros((2, 3), np.float32)}, "shape"),
        ({"w": np.zeros((2, 2), np.float64)}, "dtype"),
        ({"v": np.zeros((2, 2), np.float32)}, "keys differ"),
    ):
        with pytest.raises(InvalidReply, match=message):
            expect_arrays(_reply({}, arrays=bad), "arrays", ref)
    with pytest.raises(InvalidReply, match="missing"):
        expect_arrays(_reply({}), "arrays", ref)


def test_metrics_are_weighted_by_their_split() -> None:
    replies = {
        0: _reply(
            {"num-examples": 10, "train-loss": 1.0, "test-examples": 1, "test-accuracy": 0.0}
        ),
        1: _reply(
            {"num-examples": 30, "train-loss": 3.0, "test-examples": 3, "test-accuracy": 1.0}
        ),
    }
    out = aggregate_metrics(replies)
    assert out["train-loss"] == pytest.approx(2.5)
    assert out["test-accuracy"] == pytest.approx(0.75)
    assert out["test-accuracy-min"] == 0.0 and out["clients"] == 2.0


def test_reply_echoes_the_instruction() -> None:
    msg = protocol.instruction(4, "train", {"lr": 0.1}, arrays={"w": np.ones(2)})
    assert protocol.config_of(msg) == {"lr": 0.1}
    rep = protocol.reply(msg, 7, {"num-examples": 1})
    env = rep[protocol.ENVELOPE]
    assert (env["round"], env["message-type"], env["client-id"]) == (4, "train", 7)
    assert isinstance(
        Message(rep, reply_to=Message(msg, dst_node_id=1, message_type="train")), Message
    )


def test_metric_weights_follow_the_longest_matching_prefix() -> None:
    replies = {
        0: _reply(
            {
                "num-examples": 1,
                "test-examples": 1,
                "global-test-examples": 1,
                "global-test-accuracy": 0.0,
                "test-accuracy": 0.0,
            }
        ),
        1: _reply(
            {
                "num-examples": 1,
                "test-examples": 3,
                "global-test-examples": 9,
                "global-test-accuracy": 1.0,
                "test-accuracy": 1.0,
            }
        ),
    }
    out = aggregate_metrics(replies)
    assert out["test-accuracy"] == pytest.approx(0.75)
    assert out["global-test-accuracy"] == pytest.approx(0.9)


def test_weighted_average_of_a_generator_is_bitwise_that_of_the_list() -> None:
    rng = np.random.default_rng(1)
    models = [{"a": rng.standard_normal((5, 7)).astype(np.float32)} for _ in range(6)]
    weights = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0]
    consumed: list[int] = []

    def one_at_a_time():
        for i, m in enumerate(models):
            consumed.append(i)
            yield m

    lazy = weighted_average(one_at_a_time(), weights)
    np.testing.assert_array_equal(lazy["a"], weighted_average(models, weights)["a"])
    assert consumed == list(range(6))
    with pytest.raises(ValueError, match="5 models"):
        weighted_average(iter(models[:5]), weights)
