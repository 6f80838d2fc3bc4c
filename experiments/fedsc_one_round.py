"""One round of FedSC and of FedAvg + SC from a saved model, and what it does to the global
spectral objective (after `pollen experiment ... --out DIR`):

    python -m experiments.fedsc_one_round DIR/fedavg-sc-seed0 --alpha 0.3 --steps 1,5,25 --lr 0.03

Every client of the run computes its correlation matrix at the saved model (DP-CalR, no noise),
then trains K steps of the run's local loop (batch size, momentum, weight decay, gradient clip,
loss scale; two augmented views) from it, with FedSC's objective (alpha, fresh Rbar_{-j}) or
FedAvg + SC's (alpha 1, nothing shared); the server averages the clients' models (weighted by
training examples). Printed: the change of the global objective L and its inter-client
contrast, on the same views for every model (experiments/fedsc_objective.py). With a fresh
Rbar_{-j} and alpha = q_j the clients' gradients average to the global one (paper Eq. 6), so
for small lr x K FedSC should lower L more than FedAvg + SC; the script shows how far that
carries. Writes DIR/one-round.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from experiments.fedsc_objective import client_splits, client_views, terms
from experiments.fedsc_probe_features import evaluator_of, settings_of
from pollen.core import rundir
from pollen.core.contracts.fedsc import FedSCSettings
from pollen.core.settings import RunSettings


def one_round(
    settings: dict[str, Any],
    splits: list[tuple[Any, Any]],
    start: dict[str, np.ndarray],
    alpha: float,
    steps: int,
    lr: float,
    shared: dict[int, np.ndarray] | None,
) -> dict[str, np.ndarray]:
    """The averaged model after every client (its split and augmentation in `splits`) trains
    `steps` steps from `start`; FedSC's objective when `shared` (every client's correlation
    matrix) is given."""
    import torch

    from client.training import SGD, train_two_views
    from models.spectral import local_objective, norm_clip, others
    from models.weights import get_weights

    run, fedsc = RunSettings.of(settings), FedSCSettings.of(settings)
    mu, batch = fedsc.mu, run.batch_size
    sizes = [len(train) for train, _ in splits]
    q = {cid: float(n) for cid, n in enumerate(sizes)}
    models = []
    for cid, (train, augment) in enumerate(splits):
        x = torch.from_numpy(train.features())
        generator = torch.Generator().manual_seed(1000 + cid)
        picked = torch.randint(0, len(x), (steps * batch,), generator=generator)
        net = evaluator_of(settings).net(start)
        rbar = torch.from_numpy(others(shared, q, cid)) if shared is not None else None
        a = alpha if rbar is not None else 1.0

        def objective(z1: Any, z2: Any, a: float = a, rbar: Any = rbar) -> Any:
            return local_objective(norm_clip(z1, mu), norm_clip(z2, mu), a, rbar)

        params = [p for p in net.parameters() if p.requires_grad]
        train_two_views(
            net,
            x[picked],
            augment,
            objective,
            epochs=1,
            batch_size=batch,
            opt=SGD(params, lr, run.momentum, run.weight_decay),
            generator=generator,
            loss_scale=fedsc.loss_scale,
            grad_clip=fedsc.grad_clip,
        )
        models.append(get_weights(net))
    w = np.asarray(sizes, dtype=np.float64) / sum(sizes)
    return {k: np.tensordot(w, np.stack([m[k] for m in models]), axes=1) for k in models[0]}


def exact_correlations(
    settings: dict[str, Any], splits: list[tuple[Any, Any]], start: dict[str, np.ndarray]
) -> dict[int, Any]:
    """Every client's noiseless DP-CalR matrix at `start` (the run's passes and views)."""
    import torch

    from models.dp_correlation import dp_correlation

    fedsc = FedSCSettings.of(settings)
    net = evaluator_of(settings).net(start)
    generator = torch.Generator().manual_seed(7)
    out = {}
    for cid, (train, augment) in enumerate(splits):
        r, _ = dp_correlation(
            net,
            torch.from_numpy(train.features()),
            augment,
            fedsc.mu,
            0.0,
            views=generator,
            noise=generator,
            passes=fedsc.passes,
            views_per_pass=fedsc.views_per_pass,
            batch_size=256,
        )
        out[cid] = r.numpy()
    return out


def step_counts(text: str) -> list[int]:
    """'1,5,25' -> [1, 5, 25]; every count a positive integer."""
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"step counts must be >= 1: {text!r}")
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a run directory with final_model.npz")
    parser.add_argument("--alpha", type=float, default=0.3)
    parser.add_argument(
        "--steps", type=step_counts, default="1,5,25", help="local steps K, comma-separated"
    )
    parser.add_argument("--lr", type=float, default=0.03)
    args = parser.parse_args()
    for name in (rundir.CONFIG, rundir.FINAL_MODEL):
        if not (args.run / name).exists():
            raise SystemExit(f"{args.run}: no {name} (a run directory of a FedSC experiment?)")
    settings = settings_of(args.run)
    fedsc = FedSCSettings.of(settings)
    if fedsc.weighting == "uniform" or RunSettings.of(settings).num_clients < 2:
        raise SystemExit("needs a run with two or more clients and example-weighted averaging")
    import torch

    torch.manual_seed(0)
    evaluator = evaluator_of(settings)
    with np.load(args.run / rundir.FINAL_MODEL) as saved:
        start = dict(saved)
    splits = client_splits(settings)
    views, q = client_views(splits, 4)
    mu = fedsc.mu
    before = terms(evaluator.net(start), views, q, mu)
    shared = exact_correlations(settings, splits, start)
    rows: list[dict[str, Any]] = []
    print(f"start: global {before['global']:.4f}, inter-client {before['inter-contrast']:.3f}")
    for k in args.steps:
        for method, given in (("fedavg-sc", None), ("fedsc", shared)):
            after = terms(
                evaluator.net(one_round(settings, splits, start, args.alpha, k, args.lr, given)),
                views,
                q,
                mu,
            )
            row = {
                "method": method,
                "steps": k,
                "lr": args.lr,
                "alpha": args.alpha if given is not None else 1.0,
                "global-change": after["global"] - before["global"],
                "inter-contrast-change": after["inter-contrast"] - before["inter-contrast"],
            }
            rows.append(row)
            print(
                f"K={k:4d} {method:9s} global {row['global-change']:+.4f}  "
                f"inter-client {row['inter-contrast-change']:+.4f}"
            )
    (args.run / "one-round.json").write_text(json.dumps({"start": before, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
