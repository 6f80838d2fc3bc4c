"""Model construction by name."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from torch import nn

from models.char_lstm import NextCharacterLSTM
from models.classifiers import MLP, SmallCNN
from models.femnist import FemnistCNN
from models.linear import LinearModel
from models.mobilenet import build_mobilenet_v2
from models.resnet_cifar import ResNet18Classifier

# Each builder raises ValueError for an input shape its model cannot take.
_BUILDERS: dict[str, Callable[[tuple[int, ...], int], nn.Module]] = {
    "mlp": MLP,
    "cnn": SmallCNN,
    "linear": LinearModel,
    "mobilenet-v2": build_mobilenet_v2,
    "femnist-cnn": FemnistCNN,
    # FeDLRT's CIFAR-10 model: ResNet-18 with a fully connected head (hidden layers factorizable)
    "resnet18-cifar": ResNet18Classifier,
    "char-lstm": NextCharacterLSTM,
    # the same model with one layer of 64 units (26,244 parameters, 1/31 of it), for quick CPU runs
    "char-lstm-small": partial(NextCharacterLSTM, hidden_size=64, num_layers=1),
}
ALL_MODEL_NAMES = tuple(sorted(_BUILDERS))
"""Every name build_model accepts."""
SEQUENCE_MODEL_NAMES = ("char-lstm", "char-lstm-small")
"""Models that read token sequences (and only those)."""
MODEL_NAMES = ("cnn", "linear", "mlp", "mobilenet-v2", "resnet18-cifar")
"""Models that take any image (C, H, W), whatever its size, and output (batch, classes) logits.
The others are tied to one kind of input: femnist-cnn needs images of side >= 16, char-lstm
token sequences (char-lstm-small too; both output per-position logits)."""


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """The named model for inputs of input_shape (no batch dimension) and num_classes classes."""
    try:
        builder = _BUILDERS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known: {', '.join(ALL_MODEL_NAMES)}") from None
    if name == "cnn" and len(input_shape) != 3:
        raise ValueError(f"model 'cnn' needs image input (C, H, W), got shape {input_shape}")
    return builder(tuple(input_shape), num_classes)
