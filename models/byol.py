"""BYOL (Grill et al., NeurIPS 2020), the FedAvg + BYOL baseline of FedSC (paper Sec. 7.1).

The online network (backbone, projector, predictor) learns to predict the target network's
projection of the other view; the target is an exponential moving average of the online
backbone and projector, updated after every step with rate `beta` (0.99 in the paper's code)
and reset to the received global model at every round's start. No negatives: with one or two
classes per client nothing in the loss pushes the clients' digits apart.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from models.ssl_nets import ContrastiveNet


def byol_loss(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean over the batch of 2 - 2 cos(prediction, target); the target is a constant."""
    if prediction.shape != target.shape or prediction.ndim != 2:
        shapes = f"{tuple(prediction.shape)}, {tuple(target.shape)}"
        raise ValueError(f"prediction and target of shape (b, H) expected, got {shapes}")
    cos = F.cosine_similarity(prediction, target.detach(), dim=1)
    return (2.0 - 2.0 * cos).mean()


@torch.no_grad()
def ema_update(target: nn.Module, online: nn.Module, beta: float) -> None:
    """target <- beta * target + (1 - beta) * online for parameters; buffers (BatchNorm's
    running statistics) are copied."""
    for t, o in zip(target.parameters(), online.parameters(), strict=True):
        t.mul_(beta).add_(o.detach(), alpha=1.0 - beta)
    for kept, source in zip(target.buffers(), online.buffers(), strict=True):
        kept.copy_(source)


class BYOLPair(nn.Module):
    """Online network and its EMA target, for the two-view training loop: a view's forward
    gives [online prediction | target projection] side by side, so the loop's objective of
    two views (`symmetric_loss`) sees both networks' outputs of each."""

    def __init__(self, online: ContrastiveNet, beta: float) -> None:
        super().__init__()
        if online.predictor is None:
            raise ValueError("BYOL needs an online network with a predictor")
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"BYOL's EMA rate must be in [0, 1], got {beta}")
        self.online, self.beta = online, beta
        self.target = nn.Sequential(
            copy.deepcopy(online.backbone), copy.deepcopy(online.projector)
        ).requires_grad_(False)

    def forward(self, view: torch.Tensor) -> torch.Tensor:
        prediction = self.online.predict(view)
        with torch.no_grad():
            target = self.target(view)
        return torch.cat([prediction, target], dim=1)

    def symmetric_loss(self, out1: torch.Tensor, out2: torch.Tensor) -> torch.Tensor:
        """BYOL's symmetrised loss: view 1's prediction of view 2's target and vice versa."""
        p1, t1 = out1.chunk(2, dim=1)
        p2, t2 = out2.chunk(2, dim=1)
        return byol_loss(p1, t2) + byol_loss(p2, t1)

    def update_target(self) -> None:
        online = nn.Sequential(self.online.backbone, self.online.projector)
        ema_update(self.target, online, self.beta)
