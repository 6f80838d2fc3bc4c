"""Learning-rate schedules, computed on the server and sent with each round's instructions."""

from __future__ import annotations

import math
from collections.abc import Mapping

from pollen.settings import Scalar


def learning_rate(settings: Mapping[str, Scalar], server_round: int) -> float:
    """The client learning rate for a round; 'multistep' decays by 10x at K//2 and 3(K//4)
    (FedEM's reference schedule, counted in server rounds); 'cosine' anneals over the rounds
    (FedSC's reference code)."""
    lr = float(settings["lr"])
    if settings["lr-schedule"] == "cosine":
        low = float(settings.get("lr-min", 0.0))
        rounds = int(settings["num-rounds"])
        return low + (lr - low) * 0.5 * (1 + math.cos(math.pi * (server_round - 1) / rounds))
    if settings["lr-schedule"] == "multistep":
        rounds = int(settings["num-rounds"])
        for milestone in (rounds // 2, 3 * (rounds // 4)):
            if milestone and server_round > milestone:
                lr *= 0.1
    return lr
