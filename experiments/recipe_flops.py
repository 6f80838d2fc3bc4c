"""Forward FLOPs per example and parameters of the paper-scale recipes' models, counted with
torch.utils.flop_counter on one example (a multiply-add counts 2), for the GPU-hour estimates in
docs/recipes.md. The LSTM's recurrence is not an operator the counter knows, so char-lstm's
count is written out: 2 x 4 gates x (inputs + hidden) x hidden per layer and token, plus the
decoder.

    python -m experiments.recipe_flops
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from models import build_model
from models.adept_ae import theta_network
from models.ssl_nets import build_contrastive_net


def forward_flops(model: nn.Module, example: torch.Tensor) -> int:
    model.eval()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(example)
    return int(counter.get_total_flops())


def char_lstm_flops(tokens: int = 80, embed: int = 8, hidden: int = 256, vocab: int = 100) -> int:
    per_token = 2 * 4 * (embed + hidden) * hidden + 2 * 4 * (hidden + hidden) * hidden
    return tokens * (per_token + 2 * hidden * vocab)


def main() -> None:
    image = torch.zeros
    models: list[tuple[str, Callable[[], nn.Module], torch.Tensor | None]] = [
        ("mobilenet-v2, 3x32x32, 10 classes (FedEM CIFAR-10)",
         lambda: build_model("mobilenet-v2", (3, 32, 32), 10), image(1, 3, 32, 32)),
        ("femnist-cnn, 1x28x28, 62 classes (FedEM FEMNIST)",
         lambda: build_model("femnist-cnn", (1, 28, 28), 62), image(1, 1, 28, 28)),
        ("char-lstm, 80 tokens (FedEM Shakespeare)",
         lambda: build_model("char-lstm", (80,), 100), None),
        ("resnet18-cifar, 3x32x32 (FeDLRT CIFAR-10, dense head)",
         lambda: build_model("resnet18-cifar", (3, 32, 32), 10), image(1, 3, 32, 32)),
        ("fixup-resnet20 x8 + projector 512-1024-512 (FedSC CIFAR-10, SVHN)",
         lambda: build_contrastive_net("fixup-resnet20", (3, 32, 32), 512, 1024),
         image(1, 3, 32, 32)),
        ("linear AE 784-20-784 (ADEPT-AE MNIST/F-MNIST High)",
         lambda: theta_network((1, 28, 28), False, latent=20, channels=32, kernel=5),
         image(1, 1, 28, 28)),
        ("conv AE, latent 50 (ADEPT-AE CIFAR-10 High)",
         lambda: theta_network((3, 32, 32), False, latent=50, channels=32, kernel=5,
                               architecture="conv"), image(1, 3, 32, 32)),
        ("UNet 32/64, kernel 5 (ADEPT-DGM MNIST)",
         lambda: theta_network((1, 28, 28), True, latent=10, channels=32, kernel=5),
         image(1, 1, 28, 28)),
    ]  # fmt: skip
    print(f"{'model':70s} {'parameters':>12s} {'forward MFLOPs/example':>24s}")
    for name, build, example in models:
        torch.manual_seed(0)
        model = build()
        params = sum(p.numel() for p in model.parameters())
        flops = char_lstm_flops() if example is None else forward_flops(model, example)
        print(f"{name:70s} {params:12,d} {flops / 1e6:24.2f}")


if __name__ == "__main__":
    main()
