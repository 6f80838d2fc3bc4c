from __future__ import annotations

import torch
from torch import nn

from models.lowrank import LowRankLinear, select_layers, to_low_rank
from models.registry import build_model
from models.resnet_cifar import RESNET18_BLOCKS, CifarResNet


def test_resnet18_backbone_has_the_standard_cifar_size() -> None:
    # torchvision-style CIFAR ResNet-18 without its 512x10 output layer: 11,168,832 parameters
    backbone = CifarResNet(3, RESNET18_BLOCKS)
    assert sum(p.numel() for p in backbone.parameters()) == 11_168_832
    assert backbone(torch.zeros(2, 3, 32, 32)).shape == (2, 512)


def test_fedlrt_factorizes_the_resnet18_head_and_keeps_its_function() -> None:
    torch.manual_seed(0)
    model = build_model("resnet18-cifar", (3, 32, 32), 10).eval()
    assert select_layers(model, "hidden") == ["head.0", "head.2"]
    x = torch.randn(3, 3, 32, 32)
    dense = model(x)
    weights = {}
    for name in ("head.0", "head.2"):
        dense_layer = model.get_submodule(name)
        assert isinstance(dense_layer, nn.Linear)
        weights[name] = (dense_layer.weight.detach().clone(), dense_layer.bias.detach().clone())
    low = to_low_rank(model, {"head.0": 512, "head.2": 512})
    for name, (w, b) in weights.items():
        layer = low.get_submodule(name)
        assert isinstance(layer, LowRankLinear) and layer.bias is not None
        u, s, vh = torch.linalg.svd(w)
        with torch.no_grad():
            layer.U.copy_(u)
            layer.S.copy_(torch.diag(s))
            layer.V.copy_(vh.T)
            layer.bias.copy_(b)
    assert torch.allclose(low(x), dense, atol=1e-4)
