"""FedEM's message layout, shared by its server (strategies.fedem, strategies.dfedem,
strategies.clustered) and its clients (client.fedem, client.clustered): M models travel as one
flat array record."""

from __future__ import annotations

import numpy as np


def pack(components: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """M models in one flat record: `comp{m}.{state key}`."""
    return {f"comp{m}.{k}": v for m, comp in enumerate(components) for k, v in comp.items()}


def unpack(arrays: dict[str, np.ndarray], num: int) -> list[dict[str, np.ndarray]]:
    out: list[dict[str, np.ndarray]] = [{} for _ in range(num)]
    for key, value in arrays.items():
        head, _, rest = key.partition(".")
        out[int(head.removeprefix("comp"))][rest] = value
    return out
