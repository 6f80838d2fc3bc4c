"""FedEM's paper models: the reference code's architectures, sizes and output layouts."""

from __future__ import annotations

import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from models.char_lstm import NextCharacterLSTM
from models.femnist import FemnistCNN
from models.linear import LinearModel
from models.losses import per_sample_loss
from models.registry import ALL_MODEL_NAMES, MODEL_NAMES, build_model

REPO = Path(__file__).resolve().parents[2]

# (name, input_shape, num_classes, parameters)
PAPER_MODELS = [
    ("linear", (150,), 2, 151),
    ("femnist-cnn", (1, 28, 28), 62, 2_278_334),
    ("mobilenet-v2", (3, 32, 32), 10, 2_236_682),
    ("mobilenet-v2", (3, 32, 32), 100, 2_351_972),
    ("char-lstm", (80,), 100, 825_220),
]
ONE_OF_EACH = [PAPER_MODELS[i] for i in (0, 1, 2, 4)]


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def sample_input(name: str, shape: tuple[int, ...], num_classes: int, batch: int) -> torch.Tensor:
    if name == "char-lstm":
        return torch.randint(0, num_classes, (batch, *shape))
    return torch.randn(batch, *shape)


def shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    return {key: tuple(value.shape) for key, value in model.state_dict().items()}


@pytest.mark.parametrize(("name", "shape", "classes", "expected"), PAPER_MODELS)
def test_parameter_counts_match_the_reference(
    name: str, shape: tuple[int, ...], classes: int, expected: int
) -> None:
    assert n_params(build_model(name, shape, classes)) == expected


def test_mobilenet_size_is_the_papers() -> None:
    assert 2_200_000 <= n_params(build_model("mobilenet-v2", (3, 32, 32), 10)) <= 2_300_000


@pytest.mark.parametrize(("name", "shape", "classes", "expected"), ONE_OF_EACH[:-1])
def test_image_and_vector_models_output_one_row_of_logits_per_example(
    name: str, shape: tuple[int, ...], classes: int, expected: int
) -> None:
    out = build_model(name, shape, classes)(sample_input(name, shape, classes, 3))
    assert out.shape == (3, 1 if name == "linear" else classes)


@pytest.mark.parametrize(("name", "shape", "classes", "expected"), ONE_OF_EACH)
def test_forward_and_backward_reach_every_parameter(
    name: str, shape: tuple[int, ...], classes: int, expected: int
) -> None:
    torch.manual_seed(0)
    model = build_model(name, shape, classes)
    model.train()
    x = sample_input(name, shape, classes, 4)
    out = model(x)
    if name == "char-lstm":
        loss = F.cross_entropy(out, torch.randint(0, classes, (4, shape[0])))
    else:
        loss = per_sample_loss(out, torch.randint(0, classes, (4,))).mean()
    loss.backward()
    assert torch.isfinite(loss)
    for key, param in model.named_parameters():
        assert param.grad is not None, key
        assert torch.isfinite(param.grad).all(), key
        assert param.grad.abs().sum() > 0, key


@pytest.mark.parametrize("name", ["linear", "femnist-cnn", "mobilenet-v2", "char-lstm"])
def test_seeded_builds_are_identical_and_seeds_differ(name: str) -> None:
    shape = {"linear": (150,), "femnist-cnn": (1, 28, 28), "char-lstm": (80,)}.get(
        name, (3, 32, 32)
    )

    def state(seed: int) -> dict[str, torch.Tensor]:
        torch.manual_seed(seed)
        return build_model(name, shape, 10).state_dict()

    first, again, other = state(1), state(1), state(2)
    assert all(torch.equal(first[key], again[key]) for key in first)
    assert any(not torch.equal(first[key], other[key]) for key in first)


def test_linear_is_the_synthetic_model_with_torch_default_init() -> None:
    model = build_model("linear", (150,), 2)
    assert isinstance(model, LinearModel)
    assert shapes(model) == {"fc.weight": (1, 150), "fc.bias": (1,)}
    bound = 1 / 150**0.5  # nn.Linear draws U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    assert all(p.abs().max() <= bound for p in model.parameters())
    x = torch.randn(5, 150)
    assert torch.allclose(model(x)[:, 0], x @ model.fc.weight[0] + model.fc.bias)
    assert build_model("linear", (1, 8, 8), 10)(torch.randn(2, 1, 8, 8)).shape == (2, 10)


def test_femnist_cnn_state_dict_is_the_references() -> None:
    assert shapes(build_model("femnist-cnn", (1, 28, 28), 62)) == {
        "conv1.weight": (32, 1, 5, 5),
        "conv1.bias": (32,),
        "conv2.weight": (64, 32, 5, 5),
        "conv2.bias": (64,),
        "fc1.weight": (2048, 1024),
        "fc1.bias": (2048,),
        "output.weight": (62, 2048),
        "output.bias": (62,),
    }


@pytest.mark.parametrize(
    ("shape", "flat"), [((1, 28, 28), 1024), ((1, 16, 16), 64), ((3, 32, 20), 64 * 5 * 2)]
)
def test_femnist_cnn_flatten_size_follows_the_input(shape: tuple[int, ...], flat: int) -> None:
    model = build_model("femnist-cnn", shape, 10)
    assert isinstance(model, FemnistCNN)
    assert model.fc1.in_features == flat
    assert model(torch.randn(2, *shape)).shape == (2, 10)


def test_mobilenet_keeps_torchvisions_layout() -> None:
    model = build_model("mobilenet-v2", (3, 32, 32), 10)
    state = shapes(model)
    assert state["classifier.1.weight"] == (10, 1280)
    assert state["classifier.1.bias"] == (10,)
    assert state["features.0.0.weight"] == (32, 3, 3, 3)
    assert {key.split(".")[0] for key in state} == {"features", "classifier"}
    assert any(key.endswith("running_mean") for key in state)  # BatchNorm buffers travel too
    model.eval()
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 10)


def test_mobilenet_takes_other_channel_counts_in_its_first_convolution() -> None:
    grey = build_model("mobilenet-v2", (1, 28, 28), 10)
    colour = build_model("mobilenet-v2", (3, 28, 28), 10)
    assert shapes(grey)["features.0.0.weight"] == (32, 1, 3, 3)
    assert shapes(grey).keys() == shapes(colour).keys()
    assert n_params(colour) - n_params(grey) == 32 * 2 * 3 * 3
    assert grey(torch.randn(2, 1, 28, 28)).shape == (2, 10)


def test_mobilenet_build_uses_no_network(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("network access while building a model")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(urllib.request, "urlopen", refuse)
    monkeypatch.setattr(torch.hub, "download_url_to_file", refuse)
    monkeypatch.setattr(torch.hub, "load_state_dict_from_url", refuse)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    model = build_model("mobilenet-v2", (3, 32, 32), 100)
    assert shapes(model)["classifier.1.weight"] == (100, 1280)
    assert list(tmp_path.iterdir()) == []  # nothing cached either


def test_importing_models_leaves_torchvision_unloaded() -> None:
    code = "import sys, models; print('torchvision' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"


def test_char_lstm_outputs_classes_on_dim_one_for_token_cross_entropy() -> None:
    model = build_model("char-lstm", (80,), 100)
    assert isinstance(model, NextCharacterLSTM)
    tokens = torch.randint(0, 100, (3, 80))
    logits = model(tokens)
    assert logits.shape == (3, 100, 80)
    targets = torch.randint(0, 100, (3, 80))
    per_token = F.cross_entropy(logits, targets, reduction="none")
    assert per_token.shape == (3, 80)
    # position t's logits are the decoder applied to the LSTM state at t
    hidden, _ = model.rnn(model.encoder(tokens))
    assert torch.allclose(logits[:, :, 5], model.decoder(hidden[:, 5]), atol=1e-6)
    assert model(tokens[:, :20]).shape == (3, 100, 20)  # any sequence length


def test_char_lstm_predicts_from_the_past_only() -> None:
    model = build_model("char-lstm", (80,), 100).eval()
    tokens = torch.randint(0, 100, (2, 30))
    changed = tokens.clone()
    changed[:, 20:] = (changed[:, 20:] + 1) % 100
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    assert torch.equal(before[:, :, :20], after[:, :, :20])
    assert not torch.allclose(before[:, :, 20:], after[:, :, 20:])


def test_char_lstm_state_dict_is_the_references() -> None:
    assert shapes(build_model("char-lstm", (80,), 100)) == {
        "encoder.weight": (100, 8),
        "rnn.weight_ih_l0": (1024, 8),
        "rnn.weight_hh_l0": (1024, 256),
        "rnn.bias_ih_l0": (1024,),
        "rnn.bias_hh_l0": (1024,),
        "rnn.weight_ih_l1": (1024, 256),
        "rnn.weight_hh_l1": (1024, 256),
        "rnn.bias_ih_l1": (1024,),
        "rnn.bias_hh_l1": (1024,),
        "decoder.weight": (100, 256),
        "decoder.bias": (100,),
    }


@pytest.mark.parametrize(
    ("name", "shape", "classes", "message"),
    [
        ("femnist-cnn", (784,), 62, "image input"),
        ("femnist-cnn", (1, 15, 28), 62, "H, W >= 16"),
        ("femnist-cnn", (1, 8, 8), 10, "H, W >= 16"),
        ("femnist-cnn", (1, 28, 28), 1, "at least 2 classes"),
        ("mobilenet-v2", (3072,), 10, "image input"),
        ("mobilenet-v2", (0, 32, 32), 10, "non-empty"),
        ("char-lstm", (1, 28, 28), 100, r"shape \(seq_len,\)"),
        ("char-lstm", (0,), 100, r"shape \(seq_len,\)"),
        ("linear", (), 2, "non-empty"),
        ("linear", (150,), 1, "at least 2 classes"),
    ],
)
def test_unusable_shapes_are_refused_by_name(
    name: str, shape: tuple[int, ...], classes: int, message: str
) -> None:
    with pytest.raises(ValueError, match=f"model '{name}' needs.*{message}"):
        build_model(name, shape, classes)


def test_every_model_is_named_and_unknown_names_list_them() -> None:
    assert set(MODEL_NAMES) < set(ALL_MODEL_NAMES)
    assert {
        "linear",
        "femnist-cnn",
        "mobilenet-v2",
        "char-lstm",
        "char-lstm-small",
        "mlp",
        "cnn",
        "resnet18-cifar",
    } == set(ALL_MODEL_NAMES)
    with pytest.raises(ValueError, match="known: char-lstm, char-lstm-small, cnn, femnist-cnn"):
        build_model("resnet", (3, 32, 32), 10)
