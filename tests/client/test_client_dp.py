"""Client-level DP with the noise on the clients (`client-dp.noise-at=client`), called as
Flower calls the ClientApp: the training reply carries the update clipped and noised, its
noise comes from the client's secret (the same when a round is answered twice, different for
another client), and SCAFFOLD's two updates are noised as one."""

from __future__ import annotations

import stat
from typing import Any

import numpy as np
import pytest
from flwr.app import Context, Message, RecordDict

from client.app import app
from client.state import StateError, StateStore
from pollen.core import protocol
from pollen.core.contracts.scaffold import CONTROL, CONTROL_DELTA
from pollen.core.runconfig import resolve
from strategies.classifier import initial_weights


def _train(cfg: dict[str, Any], partition: int, **records: Any) -> RecordDict:
    ctx = Context(run_id=7, node_id=1, node_config={"partition-id": partition},
                  state=RecordDict(), run_config=dict(cfg))  # fmt: skip
    content = protocol.instruction(1, "train", {"lr": 0.1}, **records)
    return app(Message(content, dst_node_id=1, message_type="train"), ctx).content


def _cfg(run_config: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return dict(resolve({**run_config, **extra}))


def _flat(arrays: dict[str, np.ndarray]) -> np.ndarray:
    return np.concatenate([np.asarray(arrays[k], np.float64).ravel() for k in sorted(arrays)])


AT_CLIENT = {"client-dp.noise-at": "client", "client-dp.clip": 1e3,
             "client-dp.noise-multiplier": 1e-3}  # fmt: skip


def test_the_reply_is_the_update_plus_noise_of_std_z_clip(run_config: dict[str, Any]) -> None:
    model = initial_weights(run_config, 1)
    plain = protocol.arrays_of(_train(run_config, 0, arrays=model))
    noised = protocol.arrays_of(_train(_cfg(run_config, **AT_CLIENT), 0, arrays=model))
    noise = _flat(noised) - _flat(plain)  # the same training (seeded), unclipped at 1e3
    assert noise.size > 4000
    assert abs(float(noise.std()) - 1.0) < 0.05 and abs(float(noise.mean())) < 0.05


def test_the_update_is_clipped_before_the_noise(run_config: dict[str, Any]) -> None:
    model = initial_weights(run_config, 1)
    plain = protocol.arrays_of(_train(run_config, 0, arrays=model))
    tight = {**AT_CLIENT, "client-dp.clip": 0.01, "client-dp.noise-multiplier": 1e-9}
    sent = protocol.arrays_of(_train(_cfg(run_config, **tight), 0, arrays=model))
    update, start = _flat(sent) - _flat(model), _flat(plain) - _flat(model)
    assert np.linalg.norm(start) > 0.1
    assert np.linalg.norm(update) == pytest.approx(0.01, rel=1e-3)
    assert float(update @ start) / (np.linalg.norm(update) * np.linalg.norm(start)) > 0.999


def test_a_round_answered_twice_sends_the_same_noise_another_client_other_noise(
    run_config: dict[str, Any],
) -> None:
    """A resent instruction (docs/reliability.md) must not release a second noise draw of the
    same update: the noise comes from the client's secret and the round."""
    cfg, model = _cfg(run_config, **AT_CLIENT), initial_weights(run_config, 1)
    first = protocol.arrays_of(_train(cfg, 0, arrays=model))
    again = protocol.arrays_of(_train(cfg, 0, arrays=model))
    for key in first:
        np.testing.assert_array_equal(first[key], again[key])
    other_plain = protocol.arrays_of(_train(run_config, 1, arrays=model))
    other = protocol.arrays_of(_train(cfg, 1, arrays=model))
    plain = protocol.arrays_of(_train(run_config, 0, arrays=model))
    a, b = _flat(first) - _flat(plain), _flat(other) - _flat(other_plain)
    assert abs(float(np.corrcoef(a, b)[0, 1])) < 0.1  # independent draws


def test_the_secret_is_the_clients_alone(tmp_path: Any) -> None:
    store = StateStore(tmp_path / "client-0")
    secret = store.secret()
    assert len(secret) == 32 and store.secret() == secret
    mode = (tmp_path / "client-0" / "secret").stat().st_mode
    assert stat.S_IMODE(mode) == 0o600
    assert StateStore(tmp_path / "client-1").secret() != secret
    (tmp_path / "client-1" / "secret").write_bytes(b"short")
    with pytest.raises(StateError, match="holds 5 bytes, not 32"):
        StateStore(tmp_path / "client-1").secret()


def test_scaffold_noises_delta_y_and_delta_c_as_one_update(run_config: dict[str, Any]) -> None:
    cfg = _cfg(run_config, algorithm="scaffold")
    model = initial_weights(cfg, 1)
    control = {k: np.zeros_like(v) for k, v in model.items() if v.dtype.kind == "f"}
    records = {"arrays": model, CONTROL: control}
    plain = _train(cfg, 0, **records)
    noised = _train(_cfg(cfg, **AT_CLIENT), 0, **records)
    for name in ("arrays", CONTROL_DELTA):
        diff = _flat(protocol.arrays_of(noised, name)) - _flat(protocol.arrays_of(plain, name))
        assert abs(float(diff.std()) - 1.0) < 0.1, name
