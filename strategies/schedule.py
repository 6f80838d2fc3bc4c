"""Learning-rate schedules, computed on the server and sent with each round's instructions."""

from __future__ import annotations

import math
from collections.abc import Mapping

from pollen.core.settings import RunSettings, Scalar


def learning_rate(settings: Mapping[str, Scalar], server_round: int) -> float:
    """The client learning rate for a round; 'multistep' decays by 10x at K//2 and 3(K//4)
    (FedEM's reference schedule, counted in server rounds); 'late-drop' by 10x once, at 3K//4
    (ADEPT-DGM's reference code: round 75 of 100); 'cosine' anneals over the rounds (FedSC's
    reference code)."""
    run = RunSettings.of(settings)
    lr = run.lr
    if run.lr_schedule == "cosine":
        low = run.lr_min
        rounds = run.num_rounds
        return low + (lr - low) * 0.5 * (1 + math.cos(math.pi * (server_round - 1) / rounds))
    if run.lr_schedule == "late-drop":
        milestone = 3 * run.num_rounds // 4
        if milestone and server_round > milestone:
            lr *= 0.1
    if run.lr_schedule == "multistep":
        rounds = run.num_rounds
        for milestone in (rounds // 2, 3 * (rounds // 4)):
            if milestone and server_round > milestone:
                lr *= 0.1
    return lr
