"""Low-rank linear layers: the factorized forward pass and the model conversion."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from models.classifiers import MLP
from models.lowrank import LowRankLinear, load_low_rank, select_layers


def test_forward_equals_the_dense_layer_it_factorizes() -> None:
    torch.manual_seed(0)
    layer = LowRankLinear(7, 5, 3)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_()
    x = torch.randn(4, 7)
    weight = layer.U @ layer.S @ layer.V.T
    assert layer.bias is not None
    torch.testing.assert_close(layer(x), x @ weight.T + layer.bias)


def test_layer_selection() -> None:
    model = MLP((1, 8, 8), 10)
    assert select_layers(model, "hidden") == ["net.1", "net.3"]
    assert select_layers(model, "all") == ["net.1", "net.3", "net.5"]
    assert select_layers(model, "net.3") == ["net.3"]
    with pytest.raises(ValueError, match="not linear layers"):
        select_layers(model, "net.2")


def test_wire_arrays_load_into_a_low_rank_model() -> None:
    rng = np.random.default_rng(0)
    u, _ = np.linalg.qr(rng.standard_normal((200, 4)))
    v, _ = np.linalg.qr(rng.standard_normal((64, 4)))
    s = np.array([4.0, 3.0, 2.0, 1.0])
    dense = MLP((1, 8, 8), 10)
    arrays = {k: t.detach().numpy().copy() for k, t in dense.state_dict().items()}
    del arrays["net.1.weight"]
    arrays.update({"net.1.U": u, "net.1.s": s, "net.1.V": v})
    arrays = {k: a.astype(np.float32) for k, a in arrays.items()}
    model = load_low_rank(MLP((1, 8, 8), 10), arrays)
    layer = model.get_submodule("net.1")
    assert isinstance(layer, LowRankLinear) and isinstance(model.get_submodule("net.3"), nn.Linear)
    np.testing.assert_allclose(layer.S.detach().numpy(), np.diag(s), atol=0)
    x = torch.randn(2, 1, 8, 8)
    first = dense.get_submodule("net.1")
    assert isinstance(first, nn.Linear)
    with torch.no_grad():
        first.weight.copy_(torch.from_numpy(((u * s) @ v.T).astype(np.float32)))
    torch.testing.assert_close(model(x), dense(x), atol=1e-5, rtol=1e-5)
