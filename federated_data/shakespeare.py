"""Shakespeare next-character data as LEAF's preprocessing writes it (never downloaded).

LEAF (github.com/TalwalkarLab/leaf, data/shakespeare: `./preprocess.sh ... -t sample`) writes
JSON files `data/train/*.json` and `data/test/*.json`, each holding
`{"users": [...], "user_data": {user: {"x": [80-character strings], "y": [next characters]}}}`.
One user (a speaking role in a play) is one client; LEAF's own per-user train/test split is kept.
Characters are encoded over Python's `string.printable` (100 symbols), as FedEM's code does, and
a sample's targets are its string shifted by one with the next character appended (the
reference's chars[j+1:j+81]); see `ArrayDataset.targets`.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

import numpy as np

from federated_data.arrays import ArrayDataset
from federated_data.errors import DataConfigError
from federated_data.leaf import read_leaf, xy_lists

VOCABULARY = string.printable
SEQUENCE_LENGTH = 80
SUBDIR = Path("shakespeare") / "data"
"""Where under the data directory LEAF's output lies (LEAF's own layout below its data/)."""

# Per-character loss weights of FedEM's code (its Shakespeare criterion): 1 for every symbol but
# these, and the whole vector times 8.
_REFERENCE_WEIGHTS = {
    "\n": 0.43795, " ": 0.04250, ",": 0.65596, ".": 0.69872, "I": 0.97775, "a": 0.22260,
    "c": 0.81331, "d": 0.40719, "e": 0.13456, "f": 0.79087, "g": 0.95329, "h": 0.24969,
    "i": 0.27445, "l": 0.37296, "m": 0.56994, "n": 0.25207, "o": 0.19341, "r": 0.26036,
    "s": 0.25348, "t": 0.18765, "u": 0.47430, "w": 0.74706, "y": 0.63883,
}  # fmt: skip
REFERENCE_WEIGHT_SCALE = 8.0


def reference_class_weights() -> tuple[float, ...]:
    """The reference code's loss weight of every symbol of `VOCABULARY`, in its order."""
    return tuple(REFERENCE_WEIGHT_SCALE * _REFERENCE_WEIGHTS.get(c, 1.0) for c in VOCABULARY)


# byte -> index in VOCABULARY, -1 for bytes outside it
_CODES = np.full(256, -1, dtype=np.int16)
for _i, _c in enumerate(VOCABULARY):
    _CODES[ord(_c)] = _i


def how_to_get(data_dir: str | Path) -> str:
    return (
        f"expected LEAF's Shakespeare JSON files in {Path(data_dir) / SUBDIR / 'train'}/*.json "
        f"and {Path(data_dir) / SUBDIR / 'test'}/*.json; produce them with LEAF's Shakespeare "
        f"preprocessing (github.com/TalwalkarLab/leaf, data/shakespeare: ./preprocess.sh -s niid "
        f"--sf 1.0 -k 0 -t sample) and pass LEAF's data/ directory as data-dir (this dataset is "
        f"never downloaded)"
    )


def load_leaf_shakespeare(
    data_dir: str | None, download: bool
) -> tuple[ArrayDataset, np.ndarray, np.ndarray]:
    """Every user's train then test samples as one ArrayDataset of int16 token ids, with
    the user index (users sorted by name) and a test mark of every sample."""
    x, y, keys, test_mask = read_leaf("shakespeare", data_dir, download, _encode_user, how_to_get)
    return ArrayDataset(x, y, len(VOCABULARY)), keys, test_mask


def _encode_user(entry: Any, where: str) -> tuple[np.ndarray, np.ndarray]:
    """One user's samples: x token ids (n, 80) int16, y next-token ids (n,) int64."""
    xs, ys = xy_lists("shakespeare", entry, where)
    for i, (text, nxt) in enumerate(zip(xs, ys, strict=True)):
        if not isinstance(text, str) or len(text) != SEQUENCE_LENGTH:
            raise DataConfigError(
                f"dataset 'shakespeare': {where}: x[{i}] must be a string of "
                f"{SEQUENCE_LENGTH} characters, got {text!r}"
            )
        if not isinstance(nxt, str) or len(nxt) != 1:
            raise DataConfigError(
                f"dataset 'shakespeare': {where}: y[{i}] must be one character, got {nxt!r}"
            )
    tokens = _encode("".join(xs) + "".join(ys), where)
    split = len(xs) * SEQUENCE_LENGTH
    return tokens[:split].reshape(len(xs), SEQUENCE_LENGTH), tokens[split:].astype(np.int64)


def _encode(text: str, where: str) -> np.ndarray:
    """Indices in VOCABULARY; a character outside it is an error naming it."""
    try:
        raw = text.encode("latin-1")
    except UnicodeEncodeError as exc:
        raise _unknown_character(text[exc.start], where) from None
    codes = _CODES[np.frombuffer(raw, np.uint8)]
    invalid = codes < 0
    if invalid.any():
        raise _unknown_character(text[int(np.argmax(invalid))], where)
    return codes


def _unknown_character(char: str, where: str) -> DataConfigError:
    return DataConfigError(
        f"dataset 'shakespeare': {where}: character {char!r} is not in Python's "
        f"string.printable (the 100-symbol vocabulary)"
    )
