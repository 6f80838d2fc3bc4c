"""FedBuff's server step (GlobalModelStrategy.buffered_step) against its formula (Nguyen et al.,
AISTATS 2022, Alg. 1, with example weights): w + eta_g * sum_i n_i (1+s_i)^-a (w_i - w_(v_i)) /
sum_i n_i, each update against the model its client was sent."""

from __future__ import annotations

import numpy as np
import pytest

from pollen.core import protocol
from pollen.core.runconfig import resolve
from strategies.aggregate import staleness_weight
from strategies.base import BufferedReply, ClientInfo
from strategies.fedavg import FedAvg


def _strategy(**extra: object) -> FedAvg:
    settings = resolve({"dataset": "digits", "model": "linear", "async.buffer": 2, **extra})
    strategy = FedAvg(settings)
    strategy.initialize(0)
    return strategy


def _reply(
    cid: int, arrays: dict[str, np.ndarray], n: int, rnd: int, staleness: int
) -> BufferedReply:
    """Client `cid`'s reply, n examples, to round `rnd`'s instruction, `staleness` old."""
    request = protocol.instruction(rnd, "train")
    content = protocol.reply(request, cid, {protocol.NUM_EXAMPLES: n}, arrays=arrays)
    return BufferedReply(cid, content, rnd, staleness)


def _client(cid: int) -> ClientInfo:
    return ClientInfo(cid, 100 + cid, 10, 0, 0)


def test_staleness_weight_is_the_papers() -> None:
    assert staleness_weight(0, 0.5) == 1.0
    assert staleness_weight(3, 0.5) == pytest.approx(0.5)
    assert staleness_weight(7, 1.0) == pytest.approx(0.125)
    assert staleness_weight(5, 0.0) == 1.0


@pytest.mark.parametrize(("server_lr", "exponent"), [(1.0, 0.5), (0.7, 1.0)])
def test_a_buffered_step_is_the_formula(server_lr: float, exponent: float) -> None:
    s = _strategy(**{"async.server-lr": server_lr, "async.staleness-exponent": exponent})
    rng = np.random.default_rng(1)
    s.buffered_instruction(_client(0), 1)  # both sent round 1's model ...
    w1 = {k: v.copy() for k, v in s.weights.items()}
    a = {k: (v + rng.normal(size=v.shape)).astype(v.dtype) for k, v in w1.items()}
    s.buffered_step(1, [_reply(0, a, 30, 1, staleness=0)])
    w2 = {k: v.copy() for k, v in s.weights.items()}
    s.buffered_instruction(_client(1), 2)  # ... one round 2's
    b = {k: (v + rng.normal(size=v.shape)).astype(v.dtype) for k, v in w1.items()}
    c = {k: (v + rng.normal(size=v.shape)).astype(v.dtype) for k, v in w2.items()}
    buffer = [_reply(2, b, 10, 1, staleness=2), _reply(1, c, 30, 2, staleness=1)]
    metrics = s.buffered_step(3, buffer)
    for k in w1:
        step = (
            10 * (1 + 2) ** -exponent * (b[k].astype(np.float64) - w1[k])
            + 30 * (1 + 1) ** -exponent * (c[k].astype(np.float64) - w2[k])
        ) / 40
        np.testing.assert_allclose(s.weights[k], w2[k] + server_lr * step, rtol=1e-5, atol=1e-6)
    assert metrics["staleness-max"] == 2.0 and metrics["staleness-mean"] == 1.5


def test_the_models_kept_for_stale_replies_are_bounded_by_max_staleness() -> None:
    s = _strategy(**{"async.max-staleness": 2})
    for rnd in range(1, 8):
        s.buffered_instruction(_client(0), rnd)
        trained = {k: v + 1 for k, v in s.weights.items()}
        s.buffered_step(rnd, [_reply(0, trained, 5, rnd, staleness=0)])
    # a reply folded in round 8 is at most 2 versions old: it trained round 6's or 7's model
    assert sorted(s._bases) == [6, 7]
    s.buffered_instruction(_client(0), 8)
    assert sorted(s._bases) == [6, 7, 8]
