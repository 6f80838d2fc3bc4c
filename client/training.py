"""Local training and evaluation loops (plain PyTorch).

SGD is written out rather than taken from `torch.optim`: the first `torch.optim` optimizer built
in a process costs seconds of lazy imports, and in deployment every message is a new process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
from torch import nn

from models.losses import class_probabilities, per_sample_loss

ProximalTerm = Callable[[nn.Module], torch.Tensor]


def batches(n: int, batch_size: int, generator: torch.Generator | None) -> Iterator[torch.Tensor]:
    order = torch.randperm(n, generator=generator) if generator is not None else torch.arange(n)
    for start in range(0, n, batch_size):
        yield order[start : start + batch_size]


class SGD:
    """SGD with momentum and L2 weight decay; momentum buffers are kept for the state store."""

    def __init__(
        self,
        params: list[nn.Parameter],
        lr: float,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
    ) -> None:
        self.params = params
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.buffers: list[torch.Tensor | None] = [None] * len(params)

    @torch.no_grad()
    def step(self) -> None:
        for i, p in enumerate(self.params):
            if p.grad is None:
                continue
            grad = p.grad
            if self.weight_decay:
                grad = grad.add(p, alpha=self.weight_decay)
            if self.momentum:
                buf = self.buffers[i]
                if buf is None:
                    buf = grad.clone()
                else:
                    buf.mul_(self.momentum).add_(grad)
                self.buffers[i] = buf
                grad = buf
            p.add_(grad, alpha=-self.lr)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None


def train_classifier(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    generator: torch.Generator | None = None,
    proximal: ProximalTerm | None = None,
    sample_weights: torch.Tensor | None = None,
    optimizer: SGD | None = None,
    class_weights: torch.Tensor | None = None,
) -> float:
    """SGD on the negative log-likelihood for `epochs` passes; returns the last epoch's mean
    training loss. With `sample_weights` each batch minimises mean_i(w_i * loss_i), weights looked
    up by example index (FedEM's responsibility-weighted M-step). Pass `optimizer` to keep its
    momentum buffers across calls. Sequence targets (n, T) and `class_weights`: see
    models.losses."""
    model.train()
    opt = optimizer or SGD(
        [p for p in model.parameters() if p.requires_grad], lr, momentum, weight_decay
    )
    last = float("nan")
    for _ in range(epochs):
        total, count = 0.0, 0
        for idx in batches(len(y), batch_size, generator):
            opt.zero_grad()
            losses = per_sample_loss(model(x[idx]), y[idx], class_weights)
            if sample_weights is not None:
                losses = losses * sample_weights[idx]
            loss = losses.mean()
            objective = loss + proximal(model) if proximal is not None else loss
            objective.backward()
            opt.step()
            total += float(loss.detach()) * len(idx)
            count += len(idx)
        last = total / max(count, 1)
    return last


@torch.no_grad()
def per_sample_losses(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int = 1024,
    class_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Loss of every example (sequence) under `model` in eval mode, shape (n,)."""
    model.eval()
    parts = [
        per_sample_loss(model(x[s : s + batch_size]), y[s : s + batch_size], class_weights)
        for s in range(0, len(y), batch_size)
    ]
    return torch.cat(parts) if parts else torch.zeros(0)


@torch.no_grad()
def predict_probabilities(
    model: nn.Module, x: torch.Tensor, batch_size: int = 1024
) -> torch.Tensor:
    model.eval()
    parts = [
        class_probabilities(model(x[s : s + batch_size])) for s in range(0, len(x), batch_size)
    ]
    return torch.cat(parts) if parts else torch.zeros(0, 0)


TwoViewObjective = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def train_two_views(
    model: nn.Module,
    x: torch.Tensor,
    augment: Callable[[torch.Tensor, torch.Generator], torch.Tensor],
    objective: TwoViewObjective,
    *,
    epochs: int,
    batch_size: int,
    opt: SGD,
    generator: torch.Generator,
    loss_scale: float = 1.0,
    grad_clip: float = 0.0,
    after_step: Callable[[], None] | None = None,
) -> float:
    """Local self-supervised training on two augmented views per image: per batch
    `loss_scale` x objective(model(view 1), model(view 2)), optional gradient-norm clipping,
    then `after_step` (BYOL's target update). A last batch of a single image is skipped
    (BatchNorm cannot train on it, and one image has no negatives). Returns the last epoch's
    mean objective."""
    model.train()
    last = float("nan")
    for _ in range(epochs):
        total, count = 0.0, 0
        for idx in batches(len(x), batch_size, generator):
            if len(idx) < 2:
                continue
            batch = x[idx]
            loss = objective(model(augment(batch, generator)), model(augment(batch, generator)))
            opt.zero_grad()
            (loss_scale * loss).backward()
            if grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(opt.params, grad_clip)
            opt.step()
            if after_step is not None:
                after_step()
            total += float(loss.detach()) * len(idx)
            count += len(idx)
        last = total / max(count, 1)
    return last
