"""Pieces most classifier handlers share: tensors of the client's splits and its model."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from client.env import ClientEnv
from client.training import ProximalTerm, evaluate_classifier, train_classifier
from federated_data import ArrayDataset
from federated_data.catalog import dataset_info
from models import build_model


@dataclass(frozen=True)
class Tensors:
    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return len(self.y)


def tensors(ds: ArrayDataset, device: torch.device) -> Tensors:
    return Tensors(
        torch.from_numpy(ds.features()).to(device), torch.from_numpy(ds.y).long().to(device)
    )


def new_model(env: ClientEnv) -> nn.Module:
    info = dataset_info(str(env.settings["dataset"]))
    return build_model(str(env.settings["model"]), info.input_shape, info.num_classes).to(
        env.device
    )


def generator(env: ClientEnv, server_round: int, tag: str) -> torch.Generator:
    return torch.Generator().manual_seed(env.seed(server_round, tag))


@dataclass(frozen=True)
class SGDSettings:
    epochs: int
    batch_size: int
    lr: float
    momentum: float
    weight_decay: float


def sgd_settings(env: ClientEnv) -> SGDSettings:
    s = env.settings
    return SGDSettings(
        epochs=int(s["local-epochs"]),
        batch_size=int(s["batch-size"]),
        lr=float(s["lr"]),
        momentum=float(s["momentum"]),
        weight_decay=float(s["weight-decay"]),
    )


def train(
    model: nn.Module,
    data: Tensors,
    sgd: SGDSettings,
    gen: torch.Generator,
    proximal: ProximalTerm | None = None,
) -> float:
    return train_classifier(
        model,
        data.x,
        data.y,
        epochs=sgd.epochs,
        batch_size=sgd.batch_size,
        lr=sgd.lr,
        momentum=sgd.momentum,
        weight_decay=sgd.weight_decay,
        generator=gen,
        proximal=proximal,
    )


def test_metrics(model: nn.Module, test: Tensors) -> dict[str, int | float]:
    """Loss and accuracy on the client's test split (only the count when it is empty)."""
    metrics: dict[str, int | float] = {"test-examples": len(test)}
    if len(test):
        loss, acc = evaluate_classifier(model, test.x, test.y)
        metrics.update({"test-loss": loss, "test-accuracy": acc})
    return metrics
