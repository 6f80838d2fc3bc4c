"""SCAFFOLD's update rules (Karimireddy et al., ICML 2020, Algorithm 1 with option II control
variates), on dicts of NumPy arrays and independent of any network or framework.

The server holds the model x and its control variate c, each client i its own control variate
c_i (same keys and shapes as the trainable parameters; all zero at the start). In a round every
sampled client starts from y_i = x and takes K corrected local steps

    y_i <- y_i - eta_l (g_i(y_i) - c_i + c),

then updates its control variate (option II)

    c_i+ = c_i - c + (x - y_i) / (K eta_l)

and sends delta_y = y_i - x and delta_c = c_i+ - c_i. Over the clients S that answered, out of
the N that train,

    x <- x + eta_g mean_S(delta_y),        c <- c + (|S|/N) mean_S(delta_c) = c + sum_S(delta_c)/N,

which keeps c equal to the mean of all N clients' c_i. The client half (client.scaffold)
applies `correction` inside its torch training loop and calls `control_update` and `difference`;
the strategy (strategies.scaffold) calls `zeros_like` and `server_update`; `local_steps` is the
full-batch reference of the client's loop (the least-squares oracle runs it).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np

Arrays = Mapping[str, np.ndarray]


def zeros_like(arrays: Arrays, keys: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    """Zero control variates for `keys` of `arrays` (all of them by default)."""
    names = list(arrays) if keys is None else list(keys)
    return {k: np.zeros_like(arrays[k]) for k in names}


def norm(arrays: Arrays) -> float:
    """The Euclidean norm of all entries together (of c, c_i: logged each round)."""
    return math.sqrt(sum(float(np.sum(np.square(v, dtype=np.float64))) for v in arrays.values()))


def correction(c_global: Arrays, c_local: Arrays) -> dict[str, np.ndarray]:
    """c - c_i: what every local gradient is corrected by (the drift correction)."""
    return {k: np.subtract(c_global[k], c_local[k]) for k in c_global}


def corrected_step(
    y: Arrays, grad: Arrays, c_local: Arrays, c_global: Arrays, lr: float
) -> dict[str, np.ndarray]:
    """One local step y <- y - eta_l (g(y) - c_i + c); entries without a control variate
    take a plain gradient step."""
    corr = correction(c_global, c_local)
    out: dict[str, np.ndarray] = {}
    for k, value in y.items():
        g = grad[k] + corr[k] if k in corr else grad[k]
        out[k] = value - lr * g
    return out


def local_steps(
    x: Arrays,
    grad: Callable[[Arrays], Arrays],
    c_local: Arrays,
    c_global: Arrays,
    lr: float,
    steps: int,
) -> dict[str, np.ndarray]:
    """K corrected steps from y = x with the gradient oracle `grad` (full-batch: exact)."""
    y = {k: np.array(v, copy=True) for k, v in x.items()}
    for _ in range(steps):
        y = corrected_step(y, grad(y), c_local, c_global, lr)
    return y


def control_update(
    c_local: Arrays, c_global: Arrays, x: Arrays, y: Arrays, steps: int, lr: float
) -> dict[str, np.ndarray]:
    """Option II: c_i+ = c_i - c + (x - y_i) / (K eta_l), in the dtype of c_i.

    With plain SGD, (x - y_i) / (K eta_l) is the mean corrected gradient of the K steps, so
    c_i+ is the mean of the uncorrected gradients g_i(y_i) along the local path. When there
    were no steps (K eta_l = 0: no local data, or eta_l = 0) nothing was learnt and c_i is
    kept."""
    if steps <= 0 or lr <= 0:
        return {k: np.array(v, copy=True) for k, v in c_local.items()}
    scale = 1.0 / (steps * lr)
    out: dict[str, np.ndarray] = {}
    for k, ci in c_local.items():
        drift = np.asarray(x[k], np.float64) - np.asarray(y[k], np.float64)
        value = np.asarray(ci, np.float64) - np.asarray(c_global[k], np.float64) + scale * drift
        out[k] = value.astype(np.asarray(ci).dtype)
    return out


def difference(new: Arrays, old: Arrays) -> dict[str, np.ndarray]:
    """new - old, key by key, in the dtype of `old` (delta_y = y_i - x, delta_c = c_i+ - c_i)."""
    return {k: np.subtract(new[k], old[k]).astype(np.asarray(old[k]).dtype) for k in old}


def _apply(base: np.ndarray, deltas: Sequence[Arrays], key: str, scale: float) -> np.ndarray:
    """base + scale * sum_i deltas_i[key], accumulated in float64, in the dtype of `base`
    (integers, such as BatchNorm's batch counter, rounded)."""
    total = np.zeros(np.shape(base), dtype=np.float64)
    for d in deltas:
        total += np.asarray(d[key], np.float64)
    value = np.asarray(base, np.float64) + scale * total
    dtype = np.asarray(base).dtype
    return value.astype(dtype) if dtype.kind in "fc" else np.rint(value).astype(dtype)


def server_update(
    x: Arrays,
    c: Arrays,
    delta_ys: Sequence[Arrays],
    delta_cs: Sequence[Arrays],
    num_clients: int,
    global_lr: float = 1.0,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """x + eta_g mean_S(delta_y) and c + sum_S(delta_c) / N over the replies S of N clients."""
    if not delta_ys or len(delta_ys) != len(delta_cs):
        raise ValueError(
            f"need one delta_c per delta_y and at least one ({len(delta_ys)}, {len(delta_cs)})"
        )
    if num_clients < len(delta_cs):
        raise ValueError(f"{len(delta_cs)} replies from only {num_clients} clients")
    step = global_lr / len(delta_ys)
    new_x = {k: _apply(v, delta_ys, k, step) for k, v in x.items()}
    new_c = {k: _apply(v, delta_cs, k, 1.0 / num_clients) for k, v in c.items()}
    return new_x, new_c


def robust_server_update(
    x: Arrays,
    c: Arrays,
    delta_y: Arrays,
    delta_c: Arrays,
    replied: float,
    num_clients: int,
    global_lr: float = 1.0,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """`server_update` given one combined delta_y and delta_c of |S| = `replied` clients (a
    robust rule's estimate of mean_S; client-level DP's noisy mean over the expected |S|):
    x + eta_g delta_y and c + (|S|/N) delta_c."""
    if not 0 < replied <= num_clients:
        raise ValueError(f"{replied} replies from {num_clients} clients")
    new_x = {k: _apply(v, [delta_y], k, global_lr) for k, v in x.items()}
    new_c = {k: _apply(v, [delta_c], k, replied / num_clients) for k, v in c.items()}
    return new_x, new_c
