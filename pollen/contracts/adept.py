"""ADEPT's message layout, shared by its server (strategies.adept) and its clients
(client.adept): the records mu and sigma, and the rounds in which clients send them back."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MU, SIGMA = "mu", "sigma"


def shares(settings: Mapping[str, Any], server_round: int) -> bool:
    """Whether clients send mu and sigma back this round (all but local training)."""
    method = settings["adept.method"]
    if method == "fedavg-ft":
        return server_round <= tune_round(settings)
    return bool(method != "local")


def tune_round(settings: Mapping[str, Any]) -> int:
    return int(settings["adept.tune-round"]) or int(settings["num-rounds"]) // 2
