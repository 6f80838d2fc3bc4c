"""FedEM's small learning checks, on the algorithm's own math: A, it recovers the mixture and
beats FedAvg and local training; C, unseen clients fit only pi. The data are the paper's
synthetic mixture (App. I.1.5) in its "clean" variant, with 100 training rows per client.

The federation is a loop here, not Flower: each round every client runs exactly the steps of
client/fedem.py (E-step with its pi, M-step for pi, a responsibility-weighted epoch of each
component with its own momentum) and the server averages each component with weights n_t/n.
That keeps the checks at this size in seconds; the engine path is tested elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from client.training import SGD, per_sample_losses, predict_probabilities, train_classifier
from federated_data.synthetic_fedem import generate_fedem_synthetic
from models.linear import LinearModel
from models.mixture import (
    fit_mixture_weights,
    log_weights,
    mixture_probabilities,
    mixture_weights,
    responsibilities,
)

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Thousands of tiny steps: intra-op threads only add synchronisation."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


LR, MOMENTUM, WD, BATCH = 0.1, 0.9, 5e-4, 32


@dataclass
class Client:
    x: torch.Tensor
    y: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor


def _clients(num: int, dim: int, components: int, alpha: float, seed: int) -> list[Client]:
    data, _, _ = generate_fedem_synthetic(
        num,
        dim,
        components,
        alpha,
        noise=0.1,
        test_size=500,
        seed=seed,
        mode="clean",
        train_size=100,
    )
    return [
        Client(
            torch.from_numpy(x),
            torch.from_numpy(y).long(),
            torch.from_numpy(xt),
            torch.from_numpy(yt).long(),
        )
        for x, y, xt, yt in data
    ]


def _model(dim: int, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return LinearModel((dim,), 2)


def _losses(models: list[torch.nn.Module], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.stack([per_sample_losses(m, x, y) for m in models], dim=1).double()


def _accuracy(
    models: list[torch.nn.Module], pi: torch.Tensor, x: torch.Tensor, y: torch.Tensor
) -> float:
    probs = torch.stack([predict_probabilities(m, x) for m in models]).double()
    return float((mixture_probabilities(pi, probs).argmax(1) == y).double().mean())


def _average(models: list[torch.nn.Module], weights: list[float]) -> dict[str, torch.Tensor]:
    total = sum(weights)
    return {
        key: sum(w / total * m.state_dict()[key] for m, w in zip(models, weights, strict=True))
        for key in models[0].state_dict()
    }  # type: ignore[misc]


def run_fedem(
    clients: list[Client], components: int, rounds: int, dim: int, seed: int = 0
) -> tuple[list[torch.nn.Module], list[torch.Tensor]]:
    """FedEM with full participation; returns the global components and every client's pi."""
    globals_ = [_model(dim, seed + m) for m in range(components)]
    pis = [torch.full((components,), 1.0 / components, dtype=torch.float64) for _ in clients]
    local = [[_model(dim, 0) for _ in range(components)] for _ in clients]
    opts = [[SGD(list(m.parameters()), LR, MOMENTUM, WD) for m in models] for models in local]
    gen = torch.Generator().manual_seed(seed)
    for _ in range(rounds):
        for t, client in enumerate(clients):
            for mine, theirs in zip(local[t], globals_, strict=True):
                mine.load_state_dict(theirs.state_dict())
            q = responsibilities(log_weights(pis[t]), _losses(local[t], client.x, client.y))
            pis[t] = mixture_weights(q)
            for m, model in enumerate(local[t]):
                train_classifier(
                    model,
                    client.x,
                    client.y,
                    epochs=1,
                    batch_size=BATCH,
                    lr=LR,
                    generator=gen,
                    sample_weights=q[:, m].float(),
                    optimizer=opts[t][m],
                )
        for m, model in enumerate(globals_):
            model.load_state_dict(
                _average([local[t][m] for t in range(len(clients))], [len(c.y) for c in clients])
            )
    return globals_, pis


def mean_accuracy(
    models: list[torch.nn.Module], pis: list[torch.Tensor], clients: list[Client]
) -> float:
    return float(
        np.mean(
            [_accuracy(models, pi, c.x_test, c.y_test) for pi, c in zip(pis, clients, strict=True)]
        )
    )


def run_local(clients: list[Client], rounds: int, dim: int) -> float:
    """Each client alone, the same number of epochs as the federated runs."""
    gen = torch.Generator().manual_seed(0)
    accs = []
    one = torch.ones(1, dtype=torch.float64)
    for client in clients:
        model = _model(dim, 0)
        opt = SGD(list(model.parameters()), LR, MOMENTUM, WD)
        train_classifier(
            model,
            client.x,
            client.y,
            epochs=rounds,
            batch_size=BATCH,
            lr=LR,
            generator=gen,
            optimizer=opt,
        )
        accs.append(_accuracy([model], one, client.x_test, client.y_test))
    return float(np.mean(accs))


def test_oracle_a_fedem_recovers_the_mixture_and_beats_fedavg_and_local() -> None:
    """A: M = 2, pi_t ~ Dir(0.4), T = 90, d = 100, n_train = 100, 50 rounds."""
    dim, rounds = 100, 50
    clients = _clients(90, dim, 2, 0.4, seed=11)
    fedem = mean_accuracy(*run_fedem(clients, 2, rounds, dim), clients)
    fedavg = mean_accuracy(*run_fedem(clients, 1, rounds, dim), clients)  # M = 1 is FedAvg
    local = run_local(clients, rounds, dim)
    print(f"oracle A: FedEM {fedem:.3f} FedAvg {fedavg:.3f} Local {local:.3f}")
    assert fedem >= fedavg + 0.02
    assert fedem >= local + 0.05


def test_oracle_c_unseen_clients_fit_pi_by_em_with_frozen_components() -> None:
    """C: train on the first 72 of 90 clients; the last 18 only fit pi."""
    dim = 100
    clients = _clients(90, dim, 2, 0.4, seed=11)
    old, new = clients[:72], clients[72:]
    models, pis = run_fedem(old, 2, 50, dim)
    old_acc = mean_accuracy(models, pis, old)

    def new_accuracy(iterations: int) -> float:
        accs = []
        for c in new:
            pi, _ = fit_mixture_weights(_losses(models, c.x, c.y), iterations, tolerance=0.0)
            accs.append(_accuracy(models, pi, c.x_test, c.y_test))
        return float(np.mean(accs))

    uniform = mean_accuracy(models, [torch.full((2,), 0.5, dtype=torch.float64)] * len(new), new)
    one, converged = new_accuracy(1), new_accuracy(100)
    print(
        f"oracle C: old {old_acc:.3f} new: uniform {uniform:.3f}, 1 EM step {one:.3f}, "
        f"100 steps {converged:.3f}"
    )
    assert converged >= one >= uniform
    assert converged > uniform + 0.03
    assert abs(converged - old_acc) <= 0.03
