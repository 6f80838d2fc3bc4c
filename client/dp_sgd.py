"""DP-SGD (Abadi et al., CCS 2016, Algorithm 1) for the shared supervised loop, with Opacus.

One step, as Opacus' DPDataLoader + GradSampleModule + DPOptimizer run it:
1. a Poisson batch: every example is in it independently with probability q (Opacus'
   UniformWithReplacementSampler; the batch may be empty), ceil(n / B) batches an epoch;
2. the per-example gradients of the batch's loss (GradSampleModule), each clipped to l2 norm
   `max_grad_norm` = C over all parameters together;
3. their sum plus N(0, (z C)^2) on every coordinate, divided by the expected batch size
   int(n q) (DPOptimizer.pre_step, loss reduction `mean`);
4. the step of the wrapped optimizer: Pollen's `client.training.SGD`, so momentum and weight
   decay act on the noisy gradient exactly as in the non-private loop (and the momentum
   buffers persist the same way).

A data-independent term of the objective (FedProx's proximal term, SCAFFOLD's correction) is
not an example's gradient: it is added to the noisy gradient after step 3, unclipped. With
`sample_weights` (FedEM's responsibilities) example i's loss is w_i * loss_i, so its clipped
gradient is that of its weighted loss. Mixed precision is refused with DP-SGD before a run
starts (pollen.core.registry), so everything here is float32.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from client.training import SGD, ProximalTerm
from models.augment import random_hflip
from models.losses import per_sample_loss
from models.privacy import PoissonPlan


def train_private(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int,
    plan: PoissonPlan,
    noise_multiplier: float,
    max_grad_norm: float,
    optimizer: SGD,
    sampling: torch.Generator,
    noise: torch.Generator,
    proximal: ProximalTerm | None = None,
    sample_weights: torch.Tensor | None = None,
    class_weights: torch.Tensor | None = None,
    hflip: bool = False,
) -> tuple[float, int]:
    """`epochs` x `plan.steps_per_epoch` DP-SGD steps on the negative log-likelihood; returns
    (the last epoch's mean training loss over the examples drawn, 0 if none; the steps taken).
    `sampling` draws the Poisson batches (a CPU generator), `noise` the Gaussian noise (a
    generator on the parameters' device); for the guarantee nobody else may know either.
    `model` is trained in place; Opacus' hooks are removed before returning. `hflip`: each
    drawn image mirrored with probability 1/2 (models.augment.random_hflip, from `sampling`)."""
    from opacus import GradSampleModule  # lazy: opacus
    from opacus.optimizers import DPOptimizer  # lazy: opacus
    from opacus.utils.uniform_sampler import UniformWithReplacementSampler  # lazy: opacus

    n = len(y)
    if n == 0 or plan.steps_per_epoch == 0:
        return 0.0, 0  # as the plain loop reports an empty split
    model.train()
    private = GradSampleModule(model, batch_first=True, loss_reduction="mean")
    dp = DPOptimizer(
        optimizer,
        noise_multiplier=noise_multiplier,
        max_grad_norm=max_grad_norm,
        expected_batch_size=plan.expected_batch_size,
        loss_reduction="mean",
        generator=noise,
    )
    sampler = UniformWithReplacementSampler(
        num_samples=n, sample_rate=plan.sample_rate, generator=sampling, steps=plan.steps_per_epoch
    )
    params = list(dp.params)
    steps, last = 0, 0.0
    with warnings.catch_warnings():
        # the first layer's input needs no gradient, so PyTorch warns that Opacus' backward hook
        # fires on its output only: that is all the hook needs
        warnings.filterwarnings("ignore", "Full backward hook is firing", UserWarning)
        try:
            for _ in range(epochs):
                total, count = 0.0, 0
                for drawn in sampler:
                    dp.zero_grad()
                    if drawn:
                        idx = torch.tensor(drawn, dtype=torch.long, device=y.device)
                        inputs = random_hflip(x[idx], sampling) if hflip else x[idx]
                        losses = per_sample_loss(private(inputs).float(), y[idx], class_weights)
                        if sample_weights is not None:
                            losses = losses * sample_weights[idx]
                        losses.mean().backward()
                        total += float(losses.detach().sum())
                        count += len(drawn)
                    else:  # an empty batch still takes its step: noise only, as Opacus does
                        for p in params:
                            p.grad_sample = torch.zeros((0, *p.shape), dtype=p.dtype,
                                                        device=p.device)  # fmt: skip
                    dp.pre_step()  # clip, sum, add noise, divide by the expected batch size
                    if proximal is not None:
                        extra = torch.autograd.grad(proximal(model), params, allow_unused=True)
                        for p, g in zip(params, extra, strict=True):
                            if g is not None and p.grad is not None:
                                p.grad.add_(g)
                    optimizer.step()
                    steps += 1
                last = total / max(count, 1)
        finally:
            dp.zero_grad()
            private._close()
    return last, steps
