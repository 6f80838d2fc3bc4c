"""The global spectral contrastive objective of a FedSC experiment's final encoders, split as in
the paper's Eq. (4) (after `pollen experiment experiments/fedsc_mnist_5x2_e5.toml --out DIR`):

    python -m experiments.fedsc_objective DIR [--split-of fedsc] [--views 4]

FedSC's claim is that it minimises this objective, L = -Tr(R+) + 1/2 ||R||^2 over the union of
the clients' data, where FedAvg + SC minimises only the sum of the clients' own losses
(`local-sum`) and never sees the inter-client contrast. Every run's final model (and each
seed's initial model, row "untrained") is evaluated on the same data: the training splits of
the clients of method `--split-of`'s run of that seed, each client's images augmented `--views`
times with the training augmentation (a fixed generator, so every model sees the same views),
representations clipped to norm sqrt(mu). Writes DIR/objective.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from experiments.fedsc_probe_features import evaluator_of, initial_weights, settings_of, table
from pollen.core import rundir
from pollen.core.contracts.fedsc import FedSCSettings

COLUMNS = {
    "global": "global objective L",
    "contraction": "contraction",
    "intra-contrast": "intra-client contrast",
    "inter-contrast": "inter-client contrast",
    "local-sum": "sum of local losses",
    "effective-rank": "effective rank of R",
}


def client_splits(settings: dict[str, Any]) -> list[tuple[Any, Any]]:
    """Each client's training split and its training augmentation, loaded once per script."""
    from federated_data import load_client_data
    from models.augment import Augmenter
    from pollen.core.dataspec import data_spec, model_input
    from pollen.core.paths import cache_dir

    spec, cache = data_spec(settings), cache_dir(settings)
    shape, _ = model_input(settings)
    trains = [load_client_data(spec, cid, cache).train for cid in range(spec.num_clients)]
    return [(train, Augmenter(shape, train.mean, train.std)) for train in trains]


def client_views(splits: list[tuple[Any, Any]], views: int) -> tuple[list[list[Any]], list[float]]:
    """Each client's training images augmented `views` times (fixed generator), and q_j."""
    import torch

    generator = torch.Generator().manual_seed(0)
    out = []
    for train, augment in splits:
        x = torch.from_numpy(train.features())
        out.append([augment(x, generator) for _ in range(views)])
    sizes = [len(train) for train, _ in splits]
    return out, [n / sum(sizes) for n in sizes]


def terms(net: Any, views: list[list[Any]], q: list[float], mu: float) -> dict[str, float]:
    """Eq. (4)'s terms of `net` (eval mode) on the clients' views; a client's views pair as
    (1st, 2nd), (3rd, 4th), ..."""
    import torch

    from models.spectral import norm_clip, objective_terms

    pairs = []
    with torch.no_grad():
        for client in views:
            z = [norm_clip(net(v).double(), mu) for v in client]
            pairs.append((torch.cat(z[0::2]), torch.cat(z[1::2])))
    return objective_terms(pairs, q)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="results directory of a FedSC experiment")
    parser.add_argument("--split-of", default="fedsc", help="method whose client split is used")
    parser.add_argument("--views", type=int, default=4, help="augmented views per image (even)")
    args = parser.parse_args()
    if args.views < 2 or args.views % 2:
        raise SystemExit(f"--views must be an even number >= 2, got {args.views}")
    runs = sorted(args.out.glob("*-seed*/final_model.npz"))
    if not runs:
        raise SystemExit(f"no runs with a final_model.npz in {args.out}")
    results: dict[str, list[dict[str, float]]] = {}
    untrained: list[dict[str, float]] = []
    seeds = sorted({p.parent.name.rpartition("-seed")[2] for p in runs}, key=int)
    for seed in seeds:
        reference = args.out / f"{args.split_of}-seed{seed}"
        if not (reference / rundir.CONFIG).exists():
            raise SystemExit(f"{reference}: no run of --split-of {args.split_of} for seed {seed}")
        base = settings_of(reference)
        views, q = client_views(client_splits(base), args.views)
        mu = FedSCSettings.of(base).mu
        for path in (p for p in runs if p.parent.name.endswith(f"-seed{seed}")):
            method = path.parent.name.rpartition("-seed")[0]
            if not (path.parent / rundir.CONFIG).exists():
                raise SystemExit(f"{path.parent}: final_model.npz without config.json")
            evaluator = evaluator_of(settings_of(path.parent))
            with np.load(path) as saved:
                row = terms(evaluator.net(dict(saved)), views, q, mu)
            results.setdefault(method, []).append(row)
            print(path.parent.name, {k: round(v, 3) for k, v in row.items()})
        start = evaluator_of(base).net(initial_weights(base))
        untrained.append(terms(start, views, q, mu))
        print(f"untrained seed{seed}", {k: round(v, 3) for k, v in untrained[-1].items()})
    results["untrained"] = untrained
    text = table(results, COLUMNS, digits=2)
    (args.out / "objective.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
