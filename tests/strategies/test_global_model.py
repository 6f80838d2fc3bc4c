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


def _clipped(update: dict[str, np.ndarray], bound: float) -> dict[str, np.ndarray]:
    norm = float(np.sqrt(sum(float(np.sum(v.astype(np.float64) ** 2)) for v in update.values())))
    return {k: v * min(1.0, bound / norm) for k, v in update.items()}


def test_under_client_dp_a_buffered_step_is_the_noisy_sum_of_clipped_updates_over_k() -> None:
    # noise 1e-6 x clip: the step is DP-FedAvg's fixed-denominator mean of the clipped,
    # staleness-weighted updates, every client counting once (no example weights)
    clip = 0.5
    s = _strategy(**{"client-dp.noise-multiplier": 1e-6, "client-dp.clip": clip,
                     "async.buffer": 3, "async.server-lr": 0.8})  # fmt: skip
    rng = np.random.default_rng(2)
    s.buffered_instruction(_client(0), 1)
    w1 = {k: v.copy() for k, v in s.weights.items()}
    small = {k: (v + 1e-3 * rng.normal(size=v.shape)).astype(v.dtype) for k, v in w1.items()}
    large = {k: (v + rng.normal(size=v.shape)).astype(v.dtype) for k, v in w1.items()}
    metrics = s.buffered_step(1, [_reply(0, small, 30, 1, 0), _reply(1, large, 5, 1, 3)])
    d_small = {k: small[k].astype(np.float64) - w1[k] for k in w1}
    d_large = _clipped({k: 0.5 * (large[k].astype(np.float64) - w1[k]) for k in w1}, clip)
    for k in w1:
        step = (d_small[k] + d_large[k]) / 3  # over K = 3, though two replies came
        np.testing.assert_allclose(s.weights[k], w1[k] + 0.8 * step, rtol=1e-4, atol=1e-5)
    assert metrics["client-dp-clip"] == clip
    assert metrics["client-dp-noise-std"] == pytest.approx(1e-6 * clip / 3)


def test_under_client_dp_each_version_is_one_release_whoever_was_sent() -> None:
    from models.privacy import epsilon

    s = _strategy(**{"client-dp.noise-multiplier": 3.0, "client-dp.clip": 1.0})
    for rnd in (1, 2, 3):
        for cid in range(4):  # four instructions a version: nothing charged for them
            s.buffered_instruction(_client(cid), rnd)
        trained = {k: v + 0.01 for k, v in s.weights.items()}
        metrics = s.buffered_step(rnd, [_reply(rnd, trained, 5, rnd, 0)])
        # one client's update replaced in the version's sum: z / 2, no amplification
        assert metrics["client-epsilon"] == pytest.approx(epsilon([(1.5, 1.0, rnd)], 1e-5))
