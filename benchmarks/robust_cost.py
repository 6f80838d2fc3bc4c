"""What a robust rule costs the server: seconds and peak memory of one aggregation point with n
clients' updates of a model of d parameters, beside the mean that folds replies one at a time
(strategies.aggregate.RunningMean, memory of one model). Every rule goes through the
Combiner the strategies call (strategies.robust); memory is tracemalloc's peak, which counts
NumPy's buffers.

    .venv/bin/python benchmarks/run.py --parts robust [--robust-clients 100,1000]
"""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Sequence
from typing import Any

import numpy as np

CONFIGS: dict[str, dict[str, Any]] = {
    "mean (fold)": {},
    "median": {"robust.rule": "median"},
    "trimmed-mean": {"robust.rule": "trimmed-mean"},
    "krum": {"robust.rule": "krum"},
    "multi-krum": {"robust.rule": "multi-krum"},
    "geomed": {"robust.rule": "geomed"},
    "centered-clip": {"robust.rule": "centered-clip"},
    "clip + mean": {"robust.clip-quantile": 0.5},
    "nnm + trimmed-mean": {"robust.rule": "trimmed-mean", "robust.nnm": True},
}


def _updates(n: int, d: int) -> dict[int, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    return {c: {"w": rng.normal(0, 0.01, d).astype(np.float32)} for c in range(n)}


def measure(clients: Sequence[int], params: int, f_share: float = 0.1) -> list[dict[str, Any]]:
    """One row per (n, configuration): seconds, peak MB, and the peak over one model's
    float64 size (the fold holds about one)."""
    from pollen.core.runconfig import resolve
    from strategies.aggregate import RunningMean
    from strategies.robust import Combiner

    rows = []
    reference = {"w": np.zeros(params, np.float32)}
    for n in clients:
        models = _updates(n, params)
        f = max(1, int(f_share * n))
        for name, extra in CONFIGS.items():
            settings = resolve({"num-clients": n, **extra, "robust.f": f if extra else 0})
            tracemalloc.start()
            started = time.perf_counter()
            if extra:
                Combiner(settings).combine(1, "model", models, reference)
            else:
                mean = RunningMean()
                for m in models.values():
                    mean.add(m, 1.0)
                mean.result()
            seconds = time.perf_counter() - started
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            rows.append(
                {
                    "clients": n,
                    "params": params,
                    "f": f if extra else 0,
                    "rule": name,
                    "seconds": round(seconds, 4),
                    "peak-mb": round(peak / 2**20, 1),
                    "models-held": round(peak / (8 * params), 1),
                }
            )
    return rows
