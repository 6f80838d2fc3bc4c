"""FeDLRT against FedAvg as one n×n layer grows (in-process, no Flower): what one client sends
and receives per round (models.fedlrt.round_floats, float32 on the wire, simplified variance
correction) and the seconds of its local training (forward + backward + SGD step over a batch
of 64, S̃ of size 2r×2r trained with U, V frozen, against the dense layer), median of repeats.
Used by benchmarks/run.py (part fedlrt)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from models.fedlrt import augmentation_width, round_floats
from models.lowrank import LowRankLinear

BATCH = 64
STEPS = 20


def _step_seconds(layer: nn.Module, n: int, trained: list[torch.Tensor], repeats: int) -> float:
    x = torch.randn(BATCH, n)
    target = torch.randn(BATCH, n)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(STEPS):
            loss = ((layer(x) - target) ** 2).mean()
            grads = torch.autograd.grad(loss, trained)
            with torch.no_grad():
                for p, g in zip(trained, grads, strict=True):
                    p.add_(g, alpha=-1e-3)
        times.append((time.perf_counter() - t0) / STEPS)
    return statistics.median(times)


def measure(sizes: Sequence[tuple[int, ...]], repeats: int = 5) -> list[dict[str, Any]]:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rows = []
    for n, r in sizes:
        floats = round_floats(n, n, r, "simplified")
        k = r + augmentation_width(r, n, n)
        dense = nn.Linear(n, n)
        low = LowRankLinear(n, n, k)
        with torch.no_grad():
            for p in (low.U, low.S, low.V):
                p.normal_(0, n**-0.5)
        low.U.requires_grad_(False)
        low.V.requires_grad_(False)
        assert low.bias is not None
        dense_s = _step_seconds(dense, n, [dense.weight, dense.bias], repeats)
        low_s = _step_seconds(low, n, [low.S, low.bias], repeats)
        fedlrt_bytes = 4 * (floats["down"] + floats["up"] + 2 * n)  # + bias both ways
        fedavg_bytes = 4 * 2 * (n * n + n)
        rows.append(
            {
                "n": n,
                "rank": r,
                "augmented-rank": k,
                "fedlrt-bytes": fedlrt_bytes,
                "fedavg-bytes": fedavg_bytes,
                "bytes-ratio": round(fedlrt_bytes / fedavg_bytes, 4),
                "fedlrt-seconds": round(low_s, 6),
                "fedavg-seconds": round(dense_s, 6),
                "compute-ratio": round(low_s / dense_s, 4),
            }
        )
    return rows
