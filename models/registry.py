"""Model construction by name."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from models.classifiers import MLP, SmallCNN

_BUILDERS: dict[str, Callable[[tuple[int, ...], int], nn.Module]] = {
    "mlp": MLP,
    "cnn": SmallCNN,
}
MODEL_NAMES = tuple(sorted(_BUILDERS))


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    try:
        builder = _BUILDERS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(MODEL_NAMES)}") from None
    if name == "cnn" and len(input_shape) != 3:
        raise ValueError(f"model 'cnn' needs image input (C, H, W), got shape {input_shape}")
    return builder(input_shape, num_classes)
