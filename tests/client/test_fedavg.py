"""FedAvg+'s local adaptation before evaluation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from client import fedavg
from client.common import SGDSettings, new_model
from client.env import ClientEnv
from models.weights import get_weights
from pollen.core import protocol


@pytest.mark.parametrize(("unseen", "expected_lr"), [(False, 0.001), (True, 0.1)])
def test_fedavg_plus_tunes_newcomers_at_the_initial_rate(
    run_config: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    unseen: bool,
    expected_lr: float,
) -> None:
    # local-steps counts the rounds' training; the tuning stays one epoch (FedAvg+'s protocol)
    settings = {**run_config, "algorithm": "fedavg-plus", "lr": 0.1, "local-steps": 7}
    env = ClientEnv(0, settings, tmp_path, "run", Path(str(settings["cache-dir"])), None)
    model = new_model(env)
    rates: list[float] = []

    def record(*args: Any, **kwargs: Any) -> float:
        sgd = args[2]
        assert isinstance(sgd, SGDSettings)
        rates.append(sgd.lr)
        assert (sgd.epochs, sgd.steps) == (1, 0)
        return 0.0

    monkeypatch.setattr(fedavg, "train_locally", record)
    content = protocol.instruction(
        200, "evaluate", {"lr": 0.001, "unseen": unseen}, arrays=get_weights(model)
    )
    metrics = fedavg._model_metrics(model, content, env, adapt=True)
    assert rates == [expected_lr]
    assert "global-test-accuracy" in metrics and "test-accuracy" in metrics
