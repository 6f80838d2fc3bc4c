"""The floor of a simulated FedAvg round: a plain PyTorch loop in one process and one thread
that, for each client, copies the global model into a fresh model, trains it one epoch on the
client's training examples with SGD and adds it to a weighted sum; the sum divided by the
examples is the next global model (McMahan et al., 2017, Alg. 1 with every client sampled).

Same data (Pollen's own partitions of the dataset, read once before the clock starts), model
(`models.build_model`), batch size, learning rate and epochs as `pollen simulate --algorithm
fedavg` with the run's defaults; no evaluation, no messages, no files. `benchmarks/run.py
--parts loop` runs it beside Pollen and prints the ratio (docs/performance.md).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from federated_data import load_client_data
from models import build_model
from pollen.core.dataspec import data_spec, model_input, partition_of
from pollen.core.runconfig import resolve
from pollen.core.settings import RunSettings


def measure(
    clients: int, rounds: int, cache: Path, dataset: str = "mnist-5k", device: str = "cpu"
) -> dict[str, Any]:
    """Seconds of each round of the loop over `clients` clients (torch on one thread), and
    their median over rounds 2.. (round 1 as it is for Pollen: left out when there are more).
    `device`: where the models train ("cuda": every client's examples moved there before the
    clock starts, and each round waits for the GPU's work before its clock stops)."""
    settings = resolve({"algorithm": "fedavg", "dataset": dataset, "num-clients": clients})
    run = RunSettings.of(settings)
    spec = data_spec(settings, None)
    splits = [
        load_client_data(spec, partition_of(settings, c), cache).train for c in range(clients)
    ]
    on = torch.device(device)
    data = [
        (torch.from_numpy(s.features()).to(on), torch.from_numpy(s.targets()).long().to(on))
        for s in splits
    ]
    shape, classes = model_input(settings)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(run.seed)
        state = build_model(run.model, shape, classes).to(on).state_dict()
        seconds = []
        for rnd in range(rounds):
            started = time.perf_counter()
            state = _round(state, data, run, shape, classes, rnd, on)
            if on.type == "cuda":
                torch.cuda.synchronize(on)
            seconds.append(time.perf_counter() - started)
    finally:
        torch.set_num_threads(threads)
    steady = seconds[1:] if len(seconds) > 1 else seconds
    return {
        "clients": clients,
        "device": device,
        "rounds": rounds,
        "round-seconds-each": [round(s, 4) for s in seconds],
        "round-seconds": round(statistics.median(steady), 4),
        "examples": sum(len(y) for _, y in data),
        "lr": run.lr,
        "batch-size": run.batch_size,
        "epochs": run.local_epochs,
    }


def _round(
    state: dict[str, torch.Tensor],
    data: list[tuple[torch.Tensor, torch.Tensor]],
    run: RunSettings,
    shape: tuple[int, ...],
    classes: int,
    rnd: int,
    on: torch.device,
) -> dict[str, torch.Tensor]:
    total = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in state.items()}
    examples = 0
    for cid, (x, y) in enumerate(data):
        model: nn.Module = build_model(run.model, shape, classes).to(on)
        model.load_state_dict(state)
        opt = torch.optim.SGD(model.parameters(), lr=run.lr)
        order = torch.Generator().manual_seed(run.seed * 1_000_003 + rnd * 10_007 + cid)
        for _ in range(run.local_epochs):
            perm = torch.randperm(len(y), generator=order).to(on)
            for i in range(0, len(y), run.batch_size):
                batch = perm[i : i + run.batch_size]
                opt.zero_grad()
                loss = nn.functional.cross_entropy(model(x[batch]), y[batch])
                loss.backward()
                opt.step()
        with torch.no_grad():
            for k, v in model.state_dict().items():
                total[k] += v.double() * len(y)
        examples += len(y)
    return {k: (v / max(examples, 1)).to(state[k].dtype) for k, v in total.items()}
