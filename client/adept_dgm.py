"""ADEPT-DGM's client pieces beside the shared ADEPT loop (client.adept): Adam for the denoiser
(and, with adept-dgm.mu-optimizer=adam, for the client's copy of mu) with its moments in the
state store, and the final evaluation's samples: a PNG grid and a JSON
line per client in the run's `samples/` directory, and the KID of the samples against the
client's test images in the features of a small CNN trained inside the project (models.kid; not
Inception, so the values do not compare with the paper's)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import nn

from client.env import ClientEnv
from federated_data.cachefiles import exclusive_lock
from federated_data.client_data import load_client_data
from models.classifiers import SmallCNN
from models.diffusion import sample
from models.kid import features, kid, train_feature_net
from pollen.core.contracts.adept import AdeptDGMSettings

ADAM = "adam"
MU_ADAM = "mu-adam"
"""Key prefixes of the stored Adam moments: theta_i's and (adept-dgm.mu-optimizer=adam) those
of the client's copy of mu."""


def adam(
    params: Sequence[torch.Tensor], lr: float, stored: Mapping[str, np.ndarray], prefix: str = ADAM
) -> torch.optim.Adam:
    """Adam over `params`, resuming the moments `adam_arrays` saved under `prefix` (their step
    count included, so bias correction continues across rounds and restarts)."""
    opt = torch.optim.Adam(list(params), lr=lr)
    state = {
        i: {k: torch.from_numpy(np.array(stored[f"{prefix}.{i}.{k}"])) for k in _ADAM_KEYS}
        for i in range(len(params))
        if all(f"{prefix}.{i}.{k}" in stored for k in _ADAM_KEYS)
    }
    if state:
        saved = opt.state_dict()
        saved["state"] = state
        opt.load_state_dict(saved)
    return opt


_ADAM_KEYS = ("step", "exp_avg", "exp_avg_sq")


def adam_arrays(opt: torch.optim.Adam, prefix: str = ADAM) -> dict[str, np.ndarray]:
    return {
        f"{prefix}.{i}.{k}": state[k].detach().cpu().numpy()
        for i, state in opt.state_dict()["state"].items()
        for k in _ADAM_KEYS
    }


def _images(ds: Any) -> np.ndarray:
    x = np.asarray(ds.x)
    return x.astype(np.float32) / 255.0 if x.dtype == np.uint8 else x.astype(np.float32)


def feature_net(env: ClientEnv, epochs: int) -> Any:
    """The KID feature network: a SmallCNN classifier trained for `epochs` on every client's
    training split (labels used, test images never), built once per data spec and cached."""
    key = hashlib.sha256(f"{env.data_spec!r}/{epochs}".encode()).hexdigest()[:16]
    directory = Path(env.cache_dir) / "adept-dgm-features"
    path = directory / f"{key}.pt"
    directory.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(directory):
        if path.exists():
            saved = torch.load(path)
            net = SmallCNN(tuple(saved["shape"].tolist()), int(saved["classes"]))
            net.load_state_dict(saved["weights"])
            return net.eval()
        splits = [
            load_client_data(env.data_spec, i, env.cache_dir).train
            for i in range(env.data_spec.num_clients)
        ]
        x = np.concatenate([_images(s) for s in splits])
        y = np.concatenate([np.asarray(s.y) for s in splits])
        classes = int(splits[0].num_classes)
        net = train_feature_net(x, y, classes, epochs, seed=0)
        saved = {"weights": net.state_dict(), "shape": torch.tensor(x.shape[1:]),
                 "classes": torch.tensor(classes)}  # fmt: skip
        torch.save(saved, directory / f"{key}.tmp")
        (directory / f"{key}.tmp").replace(path)
        return net


def save_grid(images: np.ndarray, path: Path, columns: int = 10, scale: int = 0) -> None:
    """A PNG of images (N, 1, H, W) in [0, 1], `columns` per row, 1-pixel gaps; small images
    are enlarged (nearest neighbour) to about 28 pixels."""
    n, _, h, w = images.shape
    scale = scale or max(1, 28 // h)
    rows = -(-n // columns)
    canvas = np.ones(((h + 1) * rows + 1, (w + 1) * columns + 1), dtype=np.float32)
    for i in range(n):
        r, c = divmod(i, columns)
        canvas[1 + r * (h + 1) : 1 + r * (h + 1) + h, 1 + c * (w + 1) : 1 + c * (w + 1) + w] = (
            images[i, 0]
        )
    img = Image.fromarray((np.clip(canvas, 0, 1) * 255).round().astype(np.uint8))
    path.parent.mkdir(parents=True, exist_ok=True)
    img.resize((img.width * scale, img.height * scale), Image.Resampling.NEAREST).save(path)


def sample_report(
    env: ClientEnv, dgm: AdeptDGMSettings, model: nn.Module, test: np.ndarray, role: str
) -> dict[str, int | float]:
    """Sample `adept-dgm.samples` images with the client's model, compare them with its test
    images (KID), and save a grid of the first 50 next to the run's results."""
    count = dgm.samples
    shape = tuple(test.shape[1:])
    fake = sample(model, count, shape, dgm.diffusion, dgm.sample_steps, seed=env.seed(0, "samples"))
    out: dict[str, int | float] = {"sample-examples": count}
    if len(test) >= 2 and count >= 2:
        net = feature_net(env, dgm.feature_epochs)
        rng = np.random.default_rng(env.seed(0, "kid"))
        value, spread = kid(
            features(net, torch.from_numpy(test)), features(net, fake),
            dgm.kid_subsets, 100, rng,
        )  # fmt: skip
        out.update({"sample-kid": value, "sample-kid-std": spread})
    if env.run.out_dir:
        directory = Path(env.run.out_dir) / "samples"
        save_grid(fake[:50].numpy(), directory / f"client-{env.cid}.png")
        save_grid(test[:20], directory / f"client-{env.cid}-test.png")
        line = {"client": env.cid, "role": role, "test-images": len(test), **out}
        (directory / f"client-{env.cid}.json").write_text(json.dumps(line) + "\n")
    return out
