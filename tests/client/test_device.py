"""The client's device and mixed precision (docs/deployment.md#gpu), on a CPU-only machine:
CUDA is mocked where a test needs it present, and nothing here touches a real GPU."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import RecordDict
from torch import nn

import client.fedsc as fedsc_client
from client import common, training
from client.env import ClientEnv
from client.training import SGD, MixedPrecision, amp_dtype, to_device, train_classifier
from federated_data import ArrayDataset
from pollen.core.runconfig import resolve

ROOT = Path(__file__).resolve().parents[2]


def _env(tmp_path: Path, **settings: Any) -> ClientEnv:
    cfg = resolve({"dataset": "digits", "num-clients": 2, **settings})
    return ClientEnv(0, cfg, tmp_path, "run", tmp_path / "cache", None)


def _cuda(monkeypatch: pytest.MonkeyPatch, present: bool, count: int = 1) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: present)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count if present else 0)


# ---- device selection ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("device", "cuda", "expected"),
    [
        ("auto", False, "cpu"),
        ("auto", True, "cuda"),
        ("cpu", True, "cpu"),
        ("cuda", True, "cuda"),
    ],
)
def test_device_follows_the_setting_and_what_torch_sees(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, device: str, cuda: bool, expected: str
) -> None:
    _cuda(monkeypatch, cuda)
    assert _env(tmp_path, device=device).device == torch.device(expected)


def test_the_model_goes_to_the_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """new_model moves the model to env.device (checked by recording Module.to's device)."""
    env = _env(tmp_path, device="cpu")
    moved: list[Any] = []
    original = nn.Module.to

    def record(self: nn.Module, *args: Any, **kwargs: Any) -> nn.Module:
        moved.append(args[0] if args else kwargs.get("device"))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(nn.Module, "to", record)
    common.new_model(env)
    assert moved == [torch.device("cpu")]


# ---- data to the device ---------------------------------------------------------------------
def test_to_device_on_the_cpu_shares_the_array_and_pins_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_pinning(self: torch.Tensor) -> torch.Tensor:
        raise AssertionError("pinned on the CPU path")

    monkeypatch.setattr(torch.Tensor, "pin_memory", no_pinning)
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = to_device(array, torch.device("cpu"))
    assert out.device.type == "cpu" and out.dtype == torch.float32
    assert out.data_ptr() == array.ctypes.data  # the same memory, as torch.from_numpy
    labels = to_device(np.array([1, 2], dtype=np.int32), torch.device("cpu"), torch.long)
    assert labels.dtype == torch.long and labels.tolist() == [1, 2]


class _Copies:
    """Tensor.pin_memory and Tensor.to recorded instead of run (there is no GPU here)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.pinned: list[tuple[int, ...]] = []
        self.moves: list[tuple[Any, bool]] = []
        original_to = torch.Tensor.to

        def pin(tensor: torch.Tensor) -> torch.Tensor:
            self.pinned.append(tuple(tensor.shape))
            return tensor

        def to(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            target = args[0] if args else kwargs.get("device")
            if isinstance(target, torch.device) and target.type == "cuda":
                self.moves.append((target, bool(kwargs.get("non_blocking"))))
                return tensor
            return original_to(tensor, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, "pin_memory", pin)
        monkeypatch.setattr(torch.Tensor, "to", to)


def test_to_device_pins_and_copies_asynchronously_to_cuda(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    copies = _Copies(monkeypatch)
    cuda = torch.device("cuda")
    to_device(np.zeros((5, 3), dtype=np.float32), cuda)
    assert copies.pinned == [(5, 3)] and copies.moves == [(cuda, True)]


def test_a_split_goes_to_cuda_through_the_helper(monkeypatch: pytest.MonkeyPatch) -> None:
    copies = _Copies(monkeypatch)
    ds = ArrayDataset(np.zeros((6, 1, 2, 2), dtype=np.uint8), np.arange(6) % 2, num_classes=2)
    data = common.tensors(ds, torch.device("cuda"))
    assert len(data) == 6
    assert copies.pinned == [(6, 1, 2, 2), (6,)]  # features and labels, both pinned
    assert all(non_blocking for _, non_blocking in copies.moves) and len(copies.moves) == 2


def test_clients_move_data_only_through_the_helper() -> None:
    """One way to the device: no client module copies an array to a device by hand."""
    pattern = re.compile(r"from_numpy\([^)]*\)(\.\w+\(\))*\.(to|cuda)\(")
    offenders = [
        f"{path.name}: {line.strip()}"
        for path in sorted((ROOT / "client").glob("*.py"))
        for line in path.read_text().splitlines()
        if pattern.search(line)
    ]
    assert offenders == []


# ---- mixed precision --------------------------------------------------------------------------
def test_amp_type_per_device(monkeypatch: pytest.MonkeyPatch) -> None:
    assert amp_dtype(torch.device("cpu")) == torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert amp_dtype(torch.device("cuda")) == torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert amp_dtype(torch.device("cuda")) == torch.float16  # pre-Ampere: float16 + scaling
    assert MixedPrecision(False, torch.device("cuda")).scaler is None


def _problem() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(256, 20, generator=gen)
    return x, (x @ torch.randn(20, 3, generator=gen)).argmax(1)


def _fit(amp: bool, seen: list[torch.dtype]) -> tuple[nn.Module, float]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 3))
    model[0].register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    x, y = _problem()
    loss = train_classifier(
        model, x, y, epochs=3, batch_size=32, lr=0.1, momentum=0.9,
        generator=torch.Generator().manual_seed(1), amp=amp,
    )  # fmt: skip
    return model, loss


def test_amp_runs_the_forward_pass_in_bfloat16_and_keeps_float32_weights() -> None:
    fp32_seen: list[torch.dtype] = []
    amp_seen: list[torch.dtype] = []
    _, ref_loss = _fit(False, fp32_seen)
    model, loss = _fit(True, amp_seen)
    assert set(fp32_seen) == {torch.float32}
    assert set(amp_seen) == {torch.bfloat16}  # autocast on the CPU
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert abs(loss - ref_loss) < 0.05 and loss < 1.0  # it trains, close to float32


def test_float16_scaling_works_with_the_projects_sgd() -> None:
    """float16 (older GPUs) uses GradScaler with client.training.SGD: a step whose gradients
    overflow is skipped and the scale halved; a finite one is taken, unscaled."""
    precision = MixedPrecision(True, torch.device("cpu"), torch.float16)
    assert precision.scaler is not None and precision.dtype == torch.float16
    w = nn.Parameter(torch.ones(3))
    opt = SGD([w], lr=0.1)
    scale = precision.scaler.get_scale()
    precision.backward((w * float("inf")).sum())
    precision.step(opt)
    assert torch.equal(w.detach(), torch.ones(3)) and precision.scaler.get_scale() == scale / 2
    opt.zero_grad()
    precision.backward((w * 2.0).sum())
    precision.step(opt)
    torch.testing.assert_close(w.detach(), torch.full((3,), 0.8))  # 1 - 0.1 * 2, unscaled


def test_sgd_settings_carry_the_runs_amp(tmp_path: Path) -> None:
    assert common.sgd_settings(_env(tmp_path, amp=True)).amp is True
    assert common.sgd_settings(_env(tmp_path)).amp is False


@pytest.mark.parametrize(("handler", "expected"), [("train", False), ("train_simclr", True)])
def test_fedsc_never_trains_under_amp_and_simclr_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, handler: str, expected: bool
) -> None:
    """FedSC's spectral step passes amp=False even when the run says amp=true (its correlation
    matrices stay float32); SimCLR's step follows the run."""
    seen: list[bool] = []
    monkeypatch.setattr(fedsc_client, "_received", lambda *a, **k: nn.Linear(2, 2))
    monkeypatch.setattr(fedsc_client, "knn_metrics", lambda *a, **k: {})
    monkeypatch.setattr(fedsc_client, "_train", lambda *a, amp, **k: seen.append(amp))
    env = _env(tmp_path, algorithm="fedavg-simclr", amp=True)
    getattr(fedsc_client, handler)(RecordDict(), env)
    assert seen == [expected]


def test_train_two_views_autocasts_only_the_forward_passes() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(4, 3))
    seen: list[torch.dtype] = []
    objective_inputs: list[torch.dtype] = []

    def objective(z1: torch.Tensor, z2: torch.Tensor) -> torch.Tensor:
        objective_inputs.extend([z1.dtype, z2.dtype])
        return ((z1 - z2) ** 2).mean() + z1.pow(2).mean()

    model[1].register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    loss = training.train_two_views(
        model, torch.randn(8, 1, 2, 2), lambda x, g: x + 0.1 * torch.randn(x.shape, generator=g),
        objective, epochs=1, batch_size=4, opt=SGD(list(model.parameters()), 0.1),
        generator=torch.Generator().manual_seed(0), grad_clip=1.0, amp=True,
    )  # fmt: skip
    assert set(seen) == {torch.bfloat16} and set(objective_inputs) == {torch.float32}
    assert np.isfinite(loss)
