"""MobileNet-v2 for small images (FedEM's CIFAR-10/100 model).

The reference code starts from ImageNet-pretrained weights; those cannot be fetched here (no
network, and nothing may be downloaded), so the model starts from random initialisation. Expect
slower progress than the paper's curves early on.

torchvision is imported only when the model is built: `import models` stays free of it.
"""

from __future__ import annotations

from torch import nn

STEM_WIDTH = 32  # output channels of torchvision's first MobileNet-v2 convolution


def build_mobilenet_v2(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """torchvision's MobileNet-v2 (random init) with the head Linear(1280, num_classes).

    The head is a fresh nn.Linear, as in the reference code, which swaps classifier[1] for one
    (so it has PyTorch's default Linear init, not torchvision's N(0, 0.01)). State keys are
    torchvision's: features.*, classifier.1.weight, classifier.1.bias.

    Input (C, H, W) of any size: there is no resizing, and global average pooling absorbs the
    side (32x32 ends as 1x1 features). For C != 3 the first convolution takes C channels
    (same shape otherwise, torchvision's init), so single-channel images work too; with C = 3
    the network is exactly torchvision's.
    """
    if len(input_shape) != 3:
        raise ValueError(
            f"model 'mobilenet-v2' needs image input (C, H, W), got shape {input_shape}"
        )
    channels, height, width = input_shape
    if channels < 1 or height < 1 or width < 1:
        raise ValueError(f"model 'mobilenet-v2' needs a non-empty image shape, got {input_shape}")
    if num_classes < 2:
        raise ValueError(f"model 'mobilenet-v2' needs at least 2 classes, got {num_classes}")

    from torchvision.models import mobilenet_v2  # lazy: torchvision

    model = mobilenet_v2(weights=None, num_classes=num_classes)
    head = model.classifier[1]
    assert isinstance(head, nn.Linear)
    model.classifier[1] = nn.Linear(head.in_features, num_classes)
    if channels != 3:
        stem = model.features[0]
        assert isinstance(stem, nn.Sequential)
        conv = nn.Conv2d(channels, STEM_WIDTH, 3, stride=2, padding=1, bias=False)
        nn.init.kaiming_normal_(conv.weight, mode="fan_out")
        stem[0] = conv
    return model
