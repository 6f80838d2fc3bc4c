"""FedEM's personalised predictor on sequences: per-token probabilities mixed with pi."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from client.common import Tensors, new_model, split_tensors
from client.env import ClientEnv
from client.fedem import _losses, evaluate, mixture_metrics
from models.mixture import fit_mixture_weights
from models.weights import get_weights
from pollen import protocol
from pollen.contracts.fedem import pack
from tests.fakes import FixedLogits, settings_of


@pytest.mark.parametrize("weighted", [False, True])
def test_sequence_mixture_metrics_mix_each_token(weighted: bool) -> None:
    gen = torch.Generator().manual_seed(2)
    logits = [torch.randn(7, 5, 4, generator=gen) for _ in range(2)]  # N x C x T per component
    y = torch.randint(0, 5, (7, 4), generator=gen)
    weights = torch.rand(5, generator=gen) * 8 if weighted else None
    pi = torch.tensor([0.3, 0.7], dtype=torch.float64)
    data = Tensors(torch.arange(7), y, weights)
    metrics = mixture_metrics([FixedLogits(lg) for lg in logits], pi, data, batch_size=3)

    mixed = sum(p * torch.softmax(lg.double(), 1) for p, lg in zip(pi, logits, strict=True))
    assert isinstance(mixed, torch.Tensor)
    nll = -mixed.gather(1, y.unsqueeze(1)).squeeze(1).log()  # 7 x 4
    if weights is not None:
        nll = nll * weights.double()[y]
    assert metrics["test-examples"] == 7
    assert metrics["test-accuracy"] == pytest.approx(float((mixed.argmax(1) == y).double().mean()))
    assert metrics["test-loss"] == pytest.approx(float(nll.mean(1).mean()))


def _unseen_env(settings: dict[str, Any], root: Path) -> ClientEnv:
    """Client 2's environment, built afresh for every message as a restarted client's is: only
    what its state store holds on disk carries over."""
    return ClientEnv(2, settings, root, "run", Path(str(settings["cache-dir"])), None)


def test_an_unseen_client_one_step_warm_starts_from_the_pi_it_stored(
    run_config: dict[str, Any], tmp_path: Path
) -> None:
    """fedem.unseen-protocol=one-step: each evaluation is exactly one EM iteration from the pi
    stored at the previous one (on disk, so it survives restarts); with the components fixed,
    k evaluations give k EM iterations from uniform weights. `converge` is unchanged: EM from
    uniform weights until the tolerance, nothing stored."""
    settings = settings_of({**run_config, "algorithm": "fedem", "fedem.components": 3,
                            "fedem.unseen-protocol": "one-step"})  # fmt: skip
    env = _unseen_env(settings, tmp_path)
    models = []
    for m in range(3):
        torch.manual_seed(m)
        models.append(new_model(env))
    arrays = pack([get_weights(m) for m in models])
    losses = _losses(models, split_tensors(env, "train"))
    stored = []
    for rnd in (1, 2, 3):
        content = protocol.instruction(rnd, "evaluate", {"unseen": True}, arrays=arrays)
        reply = evaluate(content, _unseen_env(settings, tmp_path))
        metrics = protocol.metrics_of(reply)
        assert metrics["em-iterations"] == 1
        saved = _unseen_env(settings, tmp_path).state.load(before_round=rnd + 1)
        assert saved is not None and saved[1]["round"] == rnd
        pi = torch.from_numpy(saved[0]["pi"])
        stored.append(pi)
        expected, done = fit_mixture_weights(losses, rnd, tolerance=0.0)
        assert done == rnd
        torch.testing.assert_close(pi, expected, rtol=1e-12, atol=1e-14)
        # the accuracy reported is that of the mixture with the updated pi
        test = mixture_metrics(models, pi, split_tensors(env, "test"))
        assert metrics["test-accuracy"] == test["test-accuracy"]
    assert (stored[0] - stored[2]).abs().sum() > 1e-6  # each step moved pi on
    converged, iterations = fit_mixture_weights(losses, 100, 1e-6)
    assert (stored[2] - converged).abs().sum() > 1e-6  # three steps are not convergence

    settings = {**settings, "fedem.unseen-protocol": "converge"}
    content = protocol.instruction(4, "evaluate", {"unseen": True}, arrays=arrays)
    metrics = protocol.metrics_of(evaluate(content, _unseen_env(settings, tmp_path)))
    assert metrics["em-iterations"] == iterations > 1
    saved = _unseen_env(settings, tmp_path).state.load(before_round=10)
    assert saved is not None and saved[1]["round"] == 3  # converge stores nothing
    expected_accuracy = mixture_metrics(models, converged, split_tensors(env, "test"))
    assert metrics["test-accuracy"] == expected_accuracy["test-accuracy"]
