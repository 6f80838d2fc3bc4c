"""Pieces most classifier handlers share: tensors of the client's splits and its model."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from client.env import ClientEnv
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


def train_settings(env: ClientEnv) -> dict[str, float | int]:
    s = env.settings
    return {
        "epochs": int(s["local-epochs"]),
        "batch_size": int(s["batch-size"]),
        "lr": float(s["lr"]),
        "momentum": float(s["momentum"]),
        "weight_decay": float(s["weight-decay"]),
    }
