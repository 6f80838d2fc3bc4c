"""FedEM's synthetic mixture-of-linear-rules dataset (Marfoq et al. 2021, App. I.1.5).

The paper's numbers come from the authors' generator, including its quirks, so mode
"reference" replays that generator draw for draw: one legacy `np.random.RandomState(seed)`
consumed in the reference call order, with the slice bug that makes every component label rows
0..c_m-1. Modes "clean" (y = 1[<x, theta_z> + eps > 0]) and "bernoulli" (the paper's text:
y ~ Bernoulli(sigmoid(<x, theta_z> + eps))) fix the slice so that each component labels its
own rows; they exist for recovery tests that need the mixture assumption to hold.

Only numpy is imported, so the catalog and the launcher can check parameters cheaply.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from federated_data.errors import DataConfigError

__all__ = [
    "MODES",
    "PARAM_DEFAULTS",
    "ClientArrays",
    "FedEMSynthetic",
    "check_params",
    "client_sizes",
    "generate_fedem_synthetic",
    "labelled_rows",
    "resolve_params",
]

MODES: tuple[str, ...] = ("reference", "clean", "bernoulli")

# Every parameter the dataset accepts, with the reference generator's values for the paper's
# experiment (T=300 clients, d=150, M=3, alpha 0.4, noise 0.1, 5,000 test rows). Seed 1234,
# not the README's 12345, is the one whose sizes add up to Table 1's 1,570,507 examples.
# `num_clients` is filled from the data spec's client count when loaded through a DataSpec.
PARAM_DEFAULTS: dict[str, int | float | str] = {
    "num_clients": 300,
    "dimension": 150,
    "components": 3,
    "alpha": 0.4,
    "noise": 0.1,
    "test_size": 5000,
    "seed": 1234,
    "mode": "reference",
    "train_size": 0,
}

ClientArrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]
"""One client's (x_train, y_train, x_test, y_test): float32 N×d features, int64 0/1 labels."""

# Bounds of the reference generator's size draw: n_t = min(50 + lognormal, 1000).
_MIN_TRAIN, _MAX_TRAIN = 50, 1000
_WHERE = "dataset 'fedem-synthetic'"


def check_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """Every parameter in `PARAM_DEFAULTS`, type-normalised; DataConfigError names a bad one."""
    missing = sorted(set(PARAM_DEFAULTS) - set(params))
    if missing:
        raise DataConfigError(f"{_WHERE}: missing parameter(s) {', '.join(missing)}")
    out: dict[str, Any] = {
        "num_clients": _int(params, "num_clients", 1),
        "dimension": _int(params, "dimension", 1),
        "components": _int(params, "components", 1),
        "test_size": _int(params, "test_size", 1),
        "seed": _int(params, "seed", 0, 2**32 - 1),  # RandomState's seed range
        "train_size": _int(params, "train_size", 0),
        "alpha": _float(params, "alpha", strictly_positive=True),
        "noise": _float(params, "noise", strictly_positive=False),
    }
    mode = params["mode"]
    if mode not in MODES:
        raise DataConfigError(f"{_WHERE}: mode must be one of {', '.join(MODES)}, got {mode!r}")
    out["mode"] = str(mode)
    return out


def resolve_params(given: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Defaults overridden by `given`; unknown names are refused, listing the accepted ones."""
    given = dict(given or {})
    unknown = sorted(set(given) - set(PARAM_DEFAULTS))
    if unknown:
        raise DataConfigError(
            f"{_WHERE} has no parameter {', '.join(repr(u) for u in unknown)}; accepted: "
            f"{', '.join(PARAM_DEFAULTS)}"
        )
    return check_params({**PARAM_DEFAULTS, **given})


def client_sizes(num_clients: int, seed: int = 1234, train_size: int = 0) -> np.ndarray:
    """Each client's train-set size n_t, without generating any example.

    The reference draws all sizes in the stream's first call, so they depend on the seed and
    client count only.
    """
    p = resolve_params({"num_clients": num_clients, "seed": seed, "train_size": train_size})
    if p["train_size"] > 0:
        return np.full(p["num_clients"], p["train_size"], dtype=np.int64)
    return _draw_sizes(np.random.RandomState(p["seed"]), p["num_clients"])


class FedEMSynthetic:
    """The generator's shared draws (sizes, mixture weights, components), then one client at
    a time, so a caller can write clients out without holding the whole dataset.

    The RandomState is a single stream: `clients()` continues it and may be iterated once.
    """

    def __init__(
        self,
        num_clients: int,
        dimension: int = 150,
        components: int = 3,
        alpha: float = 0.4,
        noise: float = 0.1,
        test_size: int = 5000,
        seed: int = 1234,
        mode: str = "reference",
        train_size: int = 0,
    ) -> None:
        p = check_params(
            {
                "num_clients": num_clients,
                "dimension": dimension,
                "components": components,
                "alpha": alpha,
                "noise": noise,
                "test_size": test_size,
                "seed": seed,
                "mode": mode,
                "train_size": train_size,
            }
        )
        self.num_clients: int = p["num_clients"]
        self.dimension: int = p["dimension"]
        self.components: int = p["components"]
        self.noise: float = p["noise"]
        self.test_size: int = p["test_size"]
        self.mode: str = p["mode"]
        self._rs = np.random.RandomState(p["seed"])
        # (1) sizes; skipped with a fixed train_size, which then shifts every later draw.
        if p["train_size"] > 0:
            self.train_sizes = np.full(self.num_clients, p["train_size"], dtype=np.int64)
        else:
            self.train_sizes = _draw_sizes(self._rs, self.num_clients)
        # (2) one Dirichlet call per client, (3) one uniform call for all components.
        concentration = p["alpha"] * np.ones(self.components)
        self.true_pi = np.stack(
            [self._rs.dirichlet(concentration) for _ in range(self.num_clients)]
        )
        if not np.isfinite(self.true_pi).all():
            raise DataConfigError(
                f"{_WHERE}: alpha={p['alpha']} is too small for numpy's Dirichlet sampler "
                f"(it returned NaN weights); use a larger alpha"
            )
        self.true_theta = self._rs.uniform(-1.0, 1.0, size=(self.components, self.dimension))
        self._used = False

    def clients(self) -> Iterator[ClientArrays]:
        """(x_train, y_train, x_test, y_test) for clients 0..T-1, train set drawn first."""
        if self._used:
            raise RuntimeError("FedEMSynthetic.clients() continues one random stream; call once")
        self._used = True
        for t in range(self.num_clients):
            x_tr, y_tr = self._one_set(t, int(self.train_sizes[t]))
            x_te, y_te = self._one_set(t, self.test_size)
            yield x_tr, y_tr, x_te, y_te

    def _one_set(self, client: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        x, y, _ = labelled_rows(
            self._rs, n, self.true_pi[client], self.true_theta, self.noise, self.mode
        )
        # The reference calls sklearn.utils.shuffle(x, y) on the global RandomState, which
        # shuffles arange(n) in place: the same draws as RandomState.permutation(n).
        perm = self._rs.permutation(n)
        return x[perm].astype(np.float32), y[perm]


def generate_fedem_synthetic(
    num_clients: int,
    dimension: int = 150,
    components: int = 3,
    alpha: float = 0.4,
    noise: float = 0.1,
    test_size: int = 5000,
    seed: int = 1234,
    mode: str = "reference",
    train_size: int = 0,
) -> tuple[list[ClientArrays], np.ndarray, np.ndarray]:
    """Every client's (x_train, y_train, x_test, y_test), the true components theta (M×d) and
    the true mixture weights pi (T×M).

    `train_size > 0` gives every client that many training rows and skips the size draw
    (small, fast learning checks), so the rest of the stream differs from the
    reference's. Mind the size: T × test_size × d float32 values (900 MB for the paper's).
    """
    gen = FedEMSynthetic(
        num_clients, dimension, components, alpha, noise, test_size, seed, mode, train_size
    )
    return list(gen.clients()), gen.true_theta, gen.true_pi


def labelled_rows(
    rs: np.random.RandomState,
    n: int,
    pi: np.ndarray,
    theta: np.ndarray,
    noise: float,
    mode: str,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One set before its shuffle: float64 x (n×d), int64 y and the component counts c.

    Draw order per set: multinomial counts, x, then for each component its noise (and, in
    mode "bernoulli", one uniform per row for the label draw). In mode "reference" every
    component writes rows 0..c_m-1, so row i takes the label of the last component with
    i < c_m and rows i >= max(c) stay 0; the other modes give component m the rows after
    those of components 0..m-1.
    """
    counts = rs.multinomial(n, pi)
    x = rs.uniform(-1.0, 1.0, size=(n, theta.shape[1]))
    y = np.zeros(n, dtype=np.int64)
    start = 0
    for m, c in enumerate(counts.tolist()):
        rows = slice(start, start + c)
        score = x[rows] @ theta[m] + rs.normal(0.0, noise, size=c)
        if mode == "reference":
            with np.errstate(over="ignore"):
                y[rows] = np.round(1.0 / (1.0 + np.exp(-score))).astype(np.int64)
        elif mode == "clean":
            y[rows] = score > 0
        else:
            with np.errstate(over="ignore"):
                prob = 1.0 / (1.0 + np.exp(-score))
            y[rows] = rs.random_sample(c) < prob
        if mode != "reference":
            start += c
    return x, y, counts


def _draw_sizes(rs: np.random.RandomState, num_clients: int) -> np.ndarray:
    raw = rs.lognormal(mean=4.0, sigma=2.0, size=num_clients).astype(np.int64)
    return np.minimum(raw + _MIN_TRAIN, _MAX_TRAIN)


def _int(params: Mapping[str, Any], name: str, low: int, high: int | None = None) -> int:
    value = params[name]
    integral = isinstance(value, int | np.integer) or (
        isinstance(value, float | np.floating) and float(value).is_integer()
    )
    bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
    if isinstance(value, bool) or not integral:
        raise DataConfigError(f"{_WHERE}: {name} must be an integer {bounds}, got {value!r}")
    out = int(value)
    if out < low or (high is not None and out > high):
        raise DataConfigError(f"{_WHERE}: {name} must be an integer {bounds}, got {out}")
    return out


def _float(params: Mapping[str, Any], name: str, strictly_positive: bool) -> float:
    value = params[name]
    bound = "> 0" if strictly_positive else ">= 0"
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise DataConfigError(f"{_WHERE}: {name} must be a number {bound}, got {value!r}")
    out = float(value)
    if not math.isfinite(out) or out < 0 or (strictly_positive and out == 0):
        raise DataConfigError(f"{_WHERE}: {name} must be a finite number {bound}, got {value!r}")
    return out
