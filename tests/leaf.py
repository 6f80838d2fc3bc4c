"""Tiny data in LEAF's output format (Shakespeare here; FEMNIST in tests.standins), written to a
temporary directory."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from federated_data.shakespeare import SEQUENCE_LENGTH, SUBDIR


def windows(text: str) -> tuple[list[str], list[str]]:
    """LEAF's samples of a text: every 80-character window and the character after it."""
    n = len(text) - SEQUENCE_LENGTH
    return [text[j : j + SEQUENCE_LENGTH] for j in range(n)], [
        text[j + SEQUENCE_LENGTH] for j in range(n)
    ]


def write_leaf(
    data_dir: Path,
    texts: Mapping[str, str],
    train_fraction: float = 0.8,
    files: int = 1,
) -> None:
    """Each user's text as LEAF samples, its first windows in data/train, the rest in
    data/test, users spread over `files` JSON files per split."""
    users = list(texts)
    for split in ("train", "test"):
        (data_dir / SUBDIR / split).mkdir(parents=True, exist_ok=True)
    for f in range(files):
        mine = users[f::files]
        samples = {user: windows(texts[user]) for user in mine}
        for split in ("train", "test"):
            user_data = {}
            for user, (x, y) in samples.items():
                cut = int(train_fraction * len(x))
                keep = slice(None, cut) if split == "train" else slice(cut, None)
                user_data[user] = {"x": x[keep], "y": y[keep]}
            write_leaf_json(data_dir / SUBDIR / split / f"all_data_{f}_{split}.json", user_data)


def write_leaf_json(path: Path, user_data: Mapping[str, Mapping[str, list[Any]]]) -> None:
    """One LEAF JSON file: its users, their sample counts and their {"x": [...], "y": [...]}."""
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "users": list(user_data),
        "num_samples": [len(d["x"]) for d in user_data.values()],
        "user_data": {user: dict(d) for user, d in user_data.items()},
    }
    path.write_text(json.dumps(doc))


def word_text(rng: np.random.Generator, words: Sequence[str], length: int) -> str:
    """Words drawn at random and joined by spaces: text whose next character is predictable
    from the few before it, but not from frequency alone."""
    out = ""
    while len(out) < length:
        out += str(rng.choice(list(words))) + " "
    return out[:length]
