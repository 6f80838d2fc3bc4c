"""Local training and evaluation loops (plain PyTorch).

SGD is written out rather than taken from `torch.optim`: the first `torch.optim` optimizer built
in a process costs seconds of lazy imports, and in deployment every message is a new process.

Devices: `to_device` is the one way a client's data reaches its device (pinned memory and an
asynchronous copy to CUDA). Mixed precision (`amp`, `MixedPrecision`): the loops run the
model's forward passes under torch.autocast and everything after them (losses, proximal and
correction terms, the SGD step) in float32; see docs/deployment.md#gpu.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch import nn

from models.augment import random_hflip
from models.losses import class_probabilities, per_sample_loss
from models.modes import set_training

ProximalTerm = Callable[[nn.Module], torch.Tensor]


def to_device(
    data: np.ndarray | torch.Tensor, device: torch.device, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """`data` (an array or a CPU tensor) as a tensor of `dtype` on `device`. To a CUDA device it
    goes through pinned (page-locked) host memory with a non-blocking copy, which the GPU's DMA
    engine overlaps with work already queued (kernels queued later on the same stream wait for
    it); to the CPU nothing is pinned and an array's memory is shared as before."""
    tensor = torch.from_numpy(data) if isinstance(data, np.ndarray) else data
    if dtype is not None:
        tensor = tensor.to(dtype)
    if device.type != "cuda":
        return tensor.to(device)
    if tensor.device.type == "cpu":
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)


def amp_dtype(device: torch.device) -> torch.dtype:
    """The autocast type of `amp=true` on `device`: bfloat16 (CPUs, CUDA GPUs that support it:
    Ampere and later), else float16 (older CUDA GPUs), which needs loss scaling."""
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return torch.float16
    return torch.bfloat16


class MixedPrecision:
    """Autocast for a loop's forward passes and, for float16, dynamic loss scaling
    (torch.amp.GradScaler: a step whose gradients overflow is skipped and the scale halved).
    Disabled (`enabled=False`): plain float32, every method a no-op or a plain call."""

    def __init__(
        self, enabled: bool, device: torch.device, dtype: torch.dtype | None = None
    ) -> None:
        self.enabled = enabled
        self.device_type = device.type
        self.dtype = (dtype or amp_dtype(device)) if enabled else None
        self.scaler = (
            torch.amp.GradScaler(device.type) if self.dtype == torch.float16 else None
        )

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def backward(self, objective: torch.Tensor) -> None:
        if self.scaler is None:
            objective.backward()
        else:
            self.scaler.scale(objective).backward()

    def unscale(self, opt: SGD) -> None:
        """The true gradients back before they are clipped (float16 only)."""
        if self.scaler is not None:
            self.scaler.unscale_(opt)  # type: ignore[arg-type]  # duck-typed: param_groups

    def step(self, opt: SGD) -> None:
        if self.scaler is None:
            opt.step()
        else:
            self.scaler.step(opt)  # type: ignore[arg-type]  # duck-typed: param_groups, step
            self.scaler.update()


def batches(
    n: int, batch_size: int, generator: torch.Generator | None, drop_last: bool = False
) -> Iterator[torch.Tensor]:
    """Index batches of one pass over n examples (shuffled with `generator`). `drop_last` skips
    the last, incomplete batch when there is more than one batch (FedEM's reference loaders)."""
    order = torch.randperm(n, generator=generator) if generator is not None else torch.arange(n)
    stop = n - n % batch_size if drop_last and n > batch_size else n
    for start in range(0, stop, batch_size):
        batch = order[start : start + batch_size]
        _served[0] += len(batch)
        yield batch


_served = [0]


def examples_served() -> int:
    """Examples the batches of this process have served so far: a device's compute on the
    virtual clock (pollen.core.pacing)."""
    return _served[0]


def local_passes(
    n: int,
    batch_size: int,
    generator: torch.Generator | None,
    epochs: int,
    steps: int = 0,
    drop_last: bool = False,
) -> Iterator[Iterator[torch.Tensor]]:
    """The batches of a round's local training, pass by pass (each pass as `batches` makes it):
    `epochs` shuffled passes over the n examples, or with `steps` > 0 exactly `steps` batches
    whatever the epochs (local work counted in iterations, as FeDLRT's s*: Schotthöfer & Laiu,
    2024, Sec. 4.2) — passes follow one another, each reshuffled, the last cut short."""
    if steps <= 0:
        for _ in range(epochs):
            yield batches(n, batch_size, generator, drop_last)
        return
    left = steps
    while left > 0 and n > 0:
        part = list(itertools.islice(batches(n, batch_size, generator, drop_last), left))
        left -= len(part)
        yield iter(part)


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

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        """The parameters as torch.optim lays them out (GradScaler unscales through this)."""
        return [{"params": self.params}]

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

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop the gradients (always set to None; the argument is torch.optim's, which
        Opacus' DPOptimizer passes on)."""
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
    amp: bool = False,
    drop_last: bool = False,
    hflip: bool = False,
    steps: int = 0,
) -> float:
    """SGD on the negative log-likelihood for `epochs` passes, or with `steps` > 0 for exactly
    `steps` batches (`local_passes`); returns the last pass's mean training loss. With
    `sample_weights` each batch minimises mean_i(w_i * loss_i), weights looked up by example
    index (FedEM's responsibility-weighted M-step). Pass `optimizer` to keep its momentum
    buffers across calls. Sequence targets (n, T) and `class_weights`: see
    models.losses. `amp`: the forward pass under autocast (MixedPrecision), the loss, the
    `proximal` term and the step in float32. `drop_last`: see `batches`; `hflip`: each image of
    a batch mirrored with probability 1/2 (models.augment.random_hflip; needs `generator`)."""
    set_training(model)
    opt = optimizer or SGD(
        [p for p in model.parameters() if p.requires_grad], lr, momentum, weight_decay
    )
    precision = MixedPrecision(amp, x.device)
    last = float("nan")
    for local_pass in local_passes(len(y), batch_size, generator, epochs, steps, drop_last):
        total, count = 0.0, 0
        for idx in local_pass:
            opt.zero_grad()
            inputs = x[idx]
            if hflip and generator is not None:
                inputs = random_hflip(inputs, generator)
            with precision.autocast():
                logits = model(inputs)
            losses = per_sample_loss(logits.float(), y[idx], class_weights)
            if sample_weights is not None:
                losses = losses * sample_weights[idx]
            loss = losses.mean()
            objective = loss + proximal(model) if proximal is not None else loss
            precision.backward(objective)
            precision.step(opt)
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
    set_training(model, False)
    parts = [
        per_sample_loss(model(x[s : s + batch_size]), y[s : s + batch_size], class_weights)
        for s in range(0, len(y), batch_size)
    ]
    return torch.cat(parts) if parts else torch.zeros(0)


@torch.no_grad()
def predict_probabilities(
    model: nn.Module, x: torch.Tensor, batch_size: int = 1024
) -> torch.Tensor:
    set_training(model, False)
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
    amp: bool = False,
) -> float:
    """Local self-supervised training on two augmented views per image: per batch
    `loss_scale` x objective(model(view 1), model(view 2)), optional gradient-norm clipping,
    then `after_step` (BYOL's target update). A last batch of a single image is skipped
    (BatchNorm cannot train on it, and one image has no negatives). Returns the last epoch's
    mean objective. `amp`: the two forward passes under autocast (MixedPrecision); the
    augmentations, the objective (on the outputs cast back to float32), the clipping and the
    step in float32."""
    set_training(model)
    precision = MixedPrecision(amp, x.device)
    last = float("nan")
    for _ in range(epochs):
        total, count = 0.0, 0
        for idx in batches(len(x), batch_size, generator):
            if len(idx) < 2:
                continue
            batch = x[idx]
            view1, view2 = augment(batch, generator), augment(batch, generator)
            with precision.autocast():
                z1, z2 = model(view1), model(view2)
            loss = objective(z1.float(), z2.float())
            opt.zero_grad()
            precision.backward(loss_scale * loss)
            if grad_clip > 0:
                precision.unscale(opt)
                torch.nn.utils.clip_grad_norm_(opt.params, grad_clip)
            precision.step(opt)
            if after_step is not None:
                after_step()
            total += float(loss.detach()) * len(idx)
            count += len(idx)
        last = total / max(count, 1)
    return last
