"""Partitioners: split a label array into per-client index sets, deterministically from a seed.

Each scheme reproduces a split used in the federated-learning literature, so that runs here
are comparable with published numbers. Everything is plain numpy: no framework is imported.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from federated_data.errors import DataConfigError

# Coarse (superclass) label of each CIFAR-100 fine label, indexed by fine label.
CIFAR100_COARSE_OF_FINE: np.ndarray = np.array(
    [
        4,
        1,
        14,
        8,
        0,
        6,
        7,
        7,
        18,
        3,
        3,
        14,
        9,
        18,
        7,
        11,
        3,
        9,
        7,
        11,
        6,
        11,
        5,
        10,
        7,
        6,
        13,
        15,
        3,
        15,
        0,
        11,
        1,
        10,
        12,
        14,
        16,
        9,
        11,
        5,
        5,
        19,
        8,
        8,
        15,
        13,
        14,
        17,
        18,
        10,
        16,
        4,
        17,
        4,
        2,
        0,
        17,
        4,
        18,
        17,
        10,
        3,
        2,
        12,
        12,
        16,
        12,
        1,
        9,
        19,
        2,
        10,
        0,
        1,
        16,
        12,
        9,
        13,
        15,
        13,
        16,
        19,
        2,
        4,
        6,
        19,
        5,
        5,
        8,
        19,
        18,
        1,
        2,
        15,
        6,
        0,
        17,
        8,
        14,
        13,
    ],
    dtype=np.int64,
)
CIFAR100_COARSE_OF_FINE.flags.writeable = False

SCHEMES: tuple[str, ...] = (
    "iid",
    "dirichlet",
    "classes",
    "label-groups",
    "pachinko",
    "one-class",
    "natural",
)

# scheme -> (required parameters, optional parameters with their defaults)
_PARAMS: dict[str, tuple[tuple[str, ...], dict[str, Any]]] = {
    "iid": ((), {}),
    "dirichlet": (("alpha",), {"min_size": 1, "max_tries": 1000}),
    "classes": (("classes_per_client",), {}),
    "label-groups": (("alpha",), {"groups": 3}),
    "pachinko": (("coarse_of_fine",), {"alpha": 0.4, "beta": 10.0}),
    "one-class": ((), {"classes_per_client": 1}),
    "natural": (("keys",), {}),
}


def validate_partition_params(
    scheme: str,
    num_clients: int,
    num_labels: int | None,
    num_examples: int | None,
    **params: Any,
) -> dict[str, Any]:
    """Check a partition request before any data is touched; return its params with defaults.

    `num_labels`/`num_examples` may be None when not yet known (e.g. a launcher that has not
    loaded the data); the checks that need them are then left to `partition_labels`.
    """
    if scheme not in _PARAMS:
        raise DataConfigError(f"unknown partitioner {scheme!r}; valid: {', '.join(SCHEMES)}")
    required, optional = _PARAMS[scheme]
    where = f"partitioner {scheme!r}"
    for name in required:
        if name not in params:
            raise DataConfigError(f"{where} needs the parameter '{name}'")
    unknown = sorted(set(params) - set(required) - set(optional))
    if unknown:
        accepted = ", ".join((*required, *optional)) or "none"
        raise DataConfigError(
            f"{where} has no parameter {', '.join(repr(u) for u in unknown)}; accepted: {accepted}"
        )
    out: dict[str, Any] = {**optional, **params}

    n = _as_int("num_clients", num_clients, where)
    if n < 1:
        raise DataConfigError(f"num_clients must be >= 1, got {n}")
    if num_examples is not None and n > num_examples:
        raise DataConfigError(
            f"num_clients must be in [1, {num_examples}] (the number of examples), got {n}"
        )

    if "alpha" in out:
        out["alpha"] = _positive_float("alpha", out["alpha"], where)
    if "beta" in out:
        out["beta"] = _positive_float("beta", out["beta"], where)

    _check_scheme_params(scheme, out, n, num_labels, num_examples, where)
    return out


def _check_scheme_params(
    scheme: str,
    out: dict[str, Any],
    n: int,
    num_labels: int | None,
    num_examples: int | None,
    where: str,
) -> None:
    """The checks of `validate_partition_params` that belong to one scheme; converts `out`'s
    values in place."""
    if scheme == "dirichlet":
        out["min_size"] = _as_int("min_size", out["min_size"], where)
        out["max_tries"] = _as_int("max_tries", out["max_tries"], where)
        if out["min_size"] < 0:
            raise DataConfigError(f"{where}: min_size must be >= 0, got {out['min_size']}")
        if out["max_tries"] < 1:
            raise DataConfigError(f"{where}: max_tries must be >= 1, got {out['max_tries']}")
        if num_examples is not None and out["min_size"] * n > num_examples:
            raise DataConfigError(
                f"{where}: min_size must be in [0, {num_examples // n}] for {n} clients over "
                f"{num_examples} examples, got {out['min_size']}"
            )
    elif scheme == "classes":
        k = _as_int("classes_per_client", out["classes_per_client"], where)
        out["classes_per_client"] = k
        top = num_labels if num_labels is not None else "number of labels"
        if k < 1 or (num_labels is not None and k > num_labels):
            raise DataConfigError(f"{where}: classes_per_client must be in [1, {top}], got {k}")
    elif scheme == "one-class":
        k = _as_int("classes_per_client", out["classes_per_client"], where)
        out["classes_per_client"] = k
        if k < 1:
            raise DataConfigError(f"{where}: classes_per_client must be >= 1, got {k}")
        if num_labels is not None and n * k > num_labels:
            raise DataConfigError(
                f"{where}: num_clients * classes_per_client must be <= {num_labels} (the number "
                f"of labels), got {n} * {k} = {n * k}"
            )
    elif scheme == "label-groups":
        g = out["groups"] = _as_int("groups", out["groups"], where)
        top = num_labels if num_labels is not None else "number of labels"
        if g == 0 or g < -1 or (num_labels is not None and g > num_labels):
            raise DataConfigError(f"{where}: groups must be -1 or in [1, {top}], got {g}")
    elif scheme == "pachinko":
        cmap = np.asarray(out["coarse_of_fine"])
        if cmap.ndim != 1 or cmap.size == 0 or not np.issubdtype(cmap.dtype, np.integer):
            raise DataConfigError(
                f"{where}: coarse_of_fine must be a non-empty 1-D integer array (coarse label "
                "of each fine label)"
            )
        if cmap.min() < 0:
            raise DataConfigError(f"{where}: coarse_of_fine values must be >= 0")
        if num_labels is not None and num_labels > len(cmap):
            raise DataConfigError(
                f"{where}: coarse_of_fine maps {len(cmap)} fine labels but the data has "
                f"{num_labels}"
            )
        out["coarse_of_fine"] = cmap.astype(np.int64)
    elif scheme == "natural":
        keys = np.asarray(out["keys"])
        if keys.ndim != 1:
            raise DataConfigError(f"{where}: keys must be a 1-D array (one key per example)")
        if num_examples is not None and len(keys) != num_examples:
            raise DataConfigError(
                f"{where}: keys must have one entry per example ({num_examples}), got {len(keys)}"
            )
        num_keys = len(np.unique(keys))
        if n > num_keys:
            raise DataConfigError(
                f"num_clients must be in [1, {num_keys}] (the number of distinct keys), got {n}"
            )
        out["keys"] = keys


def partition_labels(
    labels: np.ndarray, scheme: str, num_clients: int, seed: int, **params: Any
) -> list[np.ndarray]:
    """Disjoint, sorted int64 index arrays, one per client; the same seed gives the same split."""
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise DataConfigError(
            f"labels must be a 1-D integer array, got {labels.dtype} {labels.shape}"
        )
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise DataConfigError(f"seed must be an integer >= 0, got {seed!r}")
    classes, by_label = _indices_by_label(labels)
    resolved = validate_partition_params(scheme, num_clients, len(classes), len(labels), **params)
    rng = np.random.default_rng(int(seed))
    parts = _SPLITTERS[scheme](labels, classes, by_label, int(num_clients), rng, resolved)
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def _as_int(name: str, value: Any, where: str) -> int:
    if isinstance(value, bool):
        raise DataConfigError(f"{where}: {name} must be an integer, got {value!r}")
    if isinstance(value, int | np.integer):
        return int(value)
    if isinstance(value, float | np.floating) and float(value).is_integer():
        return int(value)
    raise DataConfigError(f"{where}: {name} must be an integer, got {value!r}")


def _positive_float(name: str, value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise DataConfigError(f"{where}: {name} must be a number > 0, got {value!r}")
    out = float(value)
    if not math.isfinite(out) or out <= 0:
        raise DataConfigError(f"{where}: {name} must be a finite number > 0, got {value!r}")
    return out


def _indices_by_label(labels: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """Distinct labels (sorted) and, for each, the indices holding it in increasing order."""
    order = np.argsort(labels, kind="stable")
    classes, counts = np.unique(labels, return_counts=True)
    return classes, np.split(order, np.cumsum(counts)[:-1])


def _split_by_counts(indices: np.ndarray, counts: np.ndarray) -> list[np.ndarray]:
    return np.split(indices, np.cumsum(counts)[:-1])


_Splitter = Callable[
    [np.ndarray, np.ndarray, list[np.ndarray], int, np.random.Generator, Mapping[str, Any]],
    list[np.ndarray],
]


def _iid(
    labels: np.ndarray,
    classes: np.ndarray,
    by_label: list[np.ndarray],
    n: int,
    rng: np.random.Generator,
    p: Mapping[str, Any],
) -> list[np.ndarray]:
    return list(np.array_split(rng.permutation(len(labels)), n))


def _dirichlet(
    labels: np.ndarray,
    classes: np.ndarray,
    by_label: list[np.ndarray],
    n: int,
    rng: np.random.Generator,
    p: Mapping[str, Any],
) -> list[np.ndarray]:
    """Per-label Dirichlet(alpha) shares over clients (Hsu et al. 2019; NIID-Bench's code).

    As in NIID-Bench, a client already above the mean size gets no share of further labels,
    which keeps sizes from drifting apart without changing the label skew.
    """
    alpha, min_size = p["alpha"], p["min_size"]
    total = len(labels)
    for _ in range(p["max_tries"]):
        chunks: list[list[np.ndarray]] = [[] for _ in range(n)]
        sizes = np.zeros(n, dtype=np.int64)
        for idx in by_label:
            idx = rng.permutation(idx)
            share = rng.dirichlet(np.full(n, alpha))
            open_ = sizes < total / n
            share = share * open_
            if share.sum() <= 0:  # every open client drew an underflowed share
                share = open_.astype(np.float64)
            share /= share.sum()
            cuts = (np.cumsum(share) * len(idx)).astype(np.int64)[:-1]
            for j, chunk in enumerate(np.split(idx, cuts)):
                chunks[j].append(chunk)
                sizes[j] += len(chunk)
        if sizes.min() >= min_size:
            return [np.concatenate(c) for c in chunks]
    raise DataConfigError(
        f"partitioner 'dirichlet': no split with at least min_size={min_size} examples per "
        f"client after max_tries={p['max_tries']} draws (alpha={alpha}, {n} clients, "
        f"{total} examples); raise alpha, or lower min_size or num_clients"
    )


def _classes(
    labels: np.ndarray,
    classes: np.ndarray,
    by_label: list[np.ndarray],
    n: int,
    rng: np.random.Generator,
    p: Mapping[str, Any],
) -> list[np.ndarray]:
    """Shards: client i takes k consecutive labels of a seeded label cycle.

    Walking the cycle round-robin gives every label to floor or ceil of n*k/L clients; each
    label's examples are then dealt evenly among its holders.
    """
    k = p["classes_per_client"]
    num_labels = len(classes)
    cycle = rng.permutation(num_labels)
    holders: list[list[int]] = [[] for _ in range(num_labels)]
    for client in range(n):
        for j in range(k):
            holders[int(cycle[(client * k + j) % num_labels])].append(client)
    chunks: list[list[np.ndarray]] = [[] for _ in range(n)]
    for label_pos, owners in enumerate(holders):
        if not owners:
            continue
        idx = by_label[label_pos]
        if len(idx) < len(owners):
            raise DataConfigError(
                f"partitioner 'classes': label {classes[label_pos]} has {len(idx)} examples but "
                f"is shared by {len(owners)} clients; lower num_clients or classes_per_client"
            )
        pieces = np.array_split(rng.permutation(idx), len(owners))
        for owner, piece in zip(owners, pieces, strict=True):
            chunks[owner].append(piece)
    return [np.concatenate(c) if c else np.empty(0, np.int64) for c in chunks]


def _label_groups(
    labels: np.ndarray,
    classes: np.ndarray,
    by_label: list[np.ndarray],
    n: int,
    rng: np.random.Generator,
    p: Mapping[str, Any],
) -> list[np.ndarray]:
    """FedEM's split (Marfoq et al. 2021): seeded label groups, one Dirichlet draw per group.

    Group sizes follow FedEM's `iid_divide`: near-equal, smaller groups first (3, 3, 4 for
    ten labels in three groups).
    """
    alpha = p["alpha"]
    num_labels = len(classes)
    groups = num_labels if p["groups"] == -1 else p["groups"]
    shuffled = rng.permutation(num_labels)
    base, big = divmod(num_labels, groups)
    sizes = [base] * (groups - big) + [base + 1] * big
    members = np.split(shuffled, np.cumsum(sizes)[:-1])
    pools = [rng.permutation(np.concatenate([by_label[i] for i in m])) for m in members]
    chunks: list[list[np.ndarray]] = [[] for _ in range(n)]
    for pool in pools:
        weights = rng.dirichlet(np.full(n, alpha))
        weights /= weights.sum()
        counts = rng.multinomial(len(pool), weights)
        for client, piece in enumerate(_split_by_counts(pool, counts)):
            chunks[client].append(piece)
    return [np.concatenate(c) for c in chunks]


def _pachinko(
    labels: np.ndarray,
    classes: np.ndarray,
    by_label: list[np.ndarray],
    n: int,
    rng: np.random.Generator,
    p: Mapping[str, Any],
) -> list[np.ndarray]:
    """Two-stage Pachinko allocation (Reddi et al. 2021, CIFAR-100 in TFF).

    Each client draws coarse-label weights ~ Dir(alpha) and, per coarse label, fine-label
    weights ~ Dir(beta); each example is drawn coarse label first, then fine label, then
    uniformly among that fine label's unused examples. Exhausted labels get weight zero, which
    is the renormalisation the rule asks for.
    """
    cmap: np.ndarray = p["coarse_of_fine"]
    alpha, beta = p["alpha"], p["beta"]
    if int(classes[0]) < 0 or int(classes[-1]) >= len(cmap):
        raise DataConfigError(
            f"partitioner 'pachinko': fine labels must lie in [0, {len(cmap)}) to match "
            f"coarse_of_fine, got [{classes[0]}, {classes[-1]}]"
        )
    num_coarse = int(cmap.max()) + 1
    fine_of_coarse = [np.flatnonzero(cmap == c).tolist() for c in range(num_coarse)]
    pool: list[list[int]] = [[] for _ in range(len(cmap))]
    for label, idx in zip(classes, by_label, strict=True):
        pool[int(label)] = rng.permutation(idx).tolist()
    per_client = len(labels) // n

    parts: list[np.ndarray] = []
    for _ in range(n):
        coarse_w = rng.dirichlet(np.full(num_coarse, alpha))
        fine_w = [
            rng.dirichlet(np.full(len(fines), beta)) if fines else np.zeros(0)
            for fines in fine_of_coarse
        ]
        coarse_alive = [any(pool[f] for f in fines) for fines in fine_of_coarse]
        coarse_cum = _cumulative(coarse_w, coarse_alive)
        fine_cum: dict[int, list[float]] = {}
        taken: list[int] = []
        for u_coarse, u_fine in rng.random((per_client, 2)):
            c = _pick(coarse_cum, u_coarse)
            fines = fine_of_coarse[c]
            if c not in fine_cum:
                fine_cum[c] = _cumulative(fine_w[c], [bool(pool[f]) for f in fines])
            f = fines[_pick(fine_cum[c], u_fine)]
            taken.append(pool[f].pop())
            if not pool[f]:
                alive = [bool(pool[g]) for g in fines]
                if any(alive):
                    fine_cum[c] = _cumulative(fine_w[c], alive)
                else:
                    coarse_alive[c] = False
                    del fine_cum[c]
                    coarse_cum = _cumulative(coarse_w, coarse_alive)
        parts.append(np.asarray(taken, dtype=np.int64))
    return parts


def _cumulative(weights: np.ndarray, alive: list[bool]) -> list[float]:
    """Running sums of the weights of live entries; all-underflowed weights fall back to uniform."""
    w = [float(x) if ok else 0.0 for x, ok in zip(weights, alive, strict=True)]
    if sum(w) <= 0:
        w = [1.0 if ok else 0.0 for ok in alive]
    return list(itertools.accumulate(w))


def _pick(cumulative: list[float], u: float) -> int:
    """Index drawn with probability proportional to its weight, from a uniform u in [0, 1)."""
    total = cumulative[-1]
    i = bisect.bisect_right(cumulative, u * total)
    if i >= len(cumulative):  # u * total rounded up to total
        i = bisect.bisect_left(cumulative, total)
    return i


def _one_class(
    labels: np.ndarray,
    classes: np.ndarray,
    by_label: list[np.ndarray],
    n: int,
    rng: np.random.Generator,
    p: Mapping[str, Any],
) -> list[np.ndarray]:
    """Client i holds every example of the sorted labels k*i .. k*i+k-1."""
    k = p["classes_per_client"]
    return [np.concatenate(by_label[k * i : k * i + k]) for i in range(n)]


def _natural(
    labels: np.ndarray,
    classes: np.ndarray,
    by_label: list[np.ndarray],
    n: int,
    rng: np.random.Generator,
    p: Mapping[str, Any],
) -> list[np.ndarray]:
    """Client i holds the examples of the i-th distinct key (e.g. writer) in sorted order."""
    _, inverse = np.unique(p["keys"], return_inverse=True)
    _, by_key = _indices_by_label(inverse.reshape(-1))
    return by_key[:n]


_SPLITTERS: dict[str, _Splitter] = {
    "iid": _iid,
    "dirichlet": _dirichlet,
    "classes": _classes,
    "label-groups": _label_groups,
    "pachinko": _pachinko,
    "one-class": _one_class,
    "natural": _natural,
}
