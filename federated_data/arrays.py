"""In-memory labelled examples in their compact stored form, normalised only on demand.

Images stay uint8 and token sequences int16 so that cached partitions are small and fast to
load; `features()` and `targets()` give the model's input and targets when a client trains.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from federated_data.errors import DataConfigError


@dataclass(frozen=True, eq=False)
class ArrayDataset:
    """Examples `x` (uint8 N×C×H×W images, float32 N×D features or int16 N×T token ids) with
    int64 labels `y`.

    `mean`/`std` hold one value per channel (axis 1) and apply after uint8 images are scaled
    to [0, 1]; empty tuples mean no normalisation.

    Token data is next-token data: tokens and labels share the vocabulary `num_classes`, and
    y[i] is the token that follows sequence x[i]. Sequence models predict the next token at
    every position, so their targets (`targets()`) are x shifted by one with y appended.
    """

    x: np.ndarray
    y: np.ndarray
    num_classes: int
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        x, y = self.x, self.y
        if x.dtype not in (np.uint8, np.float32, np.int16):
            raise DataConfigError(f"x must be uint8 or float32 (or int16 token ids), got {x.dtype}")
        if x.ndim < 2:
            raise DataConfigError(f"x must have shape (N, ...) with N examples, got {x.shape}")
        if self.is_tokens:
            self._check_tokens()
        if y.dtype != np.int64 or y.ndim != 1:
            raise DataConfigError(f"y must be a 1-D int64 array, got {y.dtype} {y.shape}")
        if len(x) != len(y):
            raise DataConfigError(f"x has {len(x)} examples but y has {len(y)} labels")
        if self.num_classes < 1:
            raise DataConfigError(f"num_classes must be >= 1, got {self.num_classes}")
        if len(y) and (int(y.min()) < 0 or int(y.max()) >= self.num_classes):
            raise DataConfigError(
                f"labels must lie in [0, {self.num_classes}), got [{y.min()}, {y.max()}]"
            )
        if len(self.mean) != len(self.std):
            raise DataConfigError(f"mean has {len(self.mean)} values but std has {len(self.std)}")
        if self.mean and len(self.mean) not in (1, x.shape[1]):
            raise DataConfigError(
                f"mean/std need 1 or {x.shape[1]} values (one per channel), got {len(self.mean)}"
            )
        if any(s <= 0 for s in self.std):
            raise DataConfigError(f"std values must be > 0, got {self.std}")

    def _check_tokens(self) -> None:
        x = self.x
        if x.ndim != 2:
            raise DataConfigError(f"token ids must have shape (N, T), got {x.shape}")
        if self.mean or self.std:
            raise DataConfigError("token ids take no mean/std normalisation")
        if x.size and (int(x.min()) < 0 or int(x.max()) >= self.num_classes):
            raise DataConfigError(
                f"token ids must lie in [0, {self.num_classes}), got [{x.min()}, {x.max()}]"
            )

    def __len__(self) -> int:
        return len(self.y)

    @property
    def is_tokens(self) -> bool:
        """Whether x holds token sequences (next-token data) rather than images or features."""
        return bool(self.x.dtype == np.int16)

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one example, as a model's input layer needs it."""
        return tuple(int(d) for d in self.x.shape[1:])

    def subset(self, indices: np.ndarray | Sequence[int]) -> ArrayDataset:
        """The examples at `indices`, same classes and normalisation."""
        idx = np.asarray(indices, dtype=np.int64)
        return ArrayDataset(self.x[idx], self.y[idx], self.num_classes, self.mean, self.std)

    def features(self) -> np.ndarray:
        """Model input: token ids as int64 (for an embedding), else float32 with uint8 scaled
        to [0, 1], then `(value - mean) / std` per channel."""
        if self.is_tokens:
            return self.x.astype(np.int64)
        out = self.x.astype(np.float32)
        if self.x.dtype == np.uint8:
            out /= np.float32(255.0)
        if self.mean:
            shape = (1, len(self.mean)) + (1,) * (self.x.ndim - 2)
            out -= np.asarray(self.mean, dtype=np.float32).reshape(shape)
            out /= np.asarray(self.std, dtype=np.float32).reshape(shape)
        return out

    def targets(self) -> np.ndarray:
        """What the model is trained to output: the labels (N,), or for token data the next
        token at every position (N, T), int64."""
        if not self.is_tokens:
            return self.y
        return np.concatenate([self.x[:, 1:].astype(np.int64), self.y[:, None]], axis=1)

    def label_counts(self) -> np.ndarray:
        """Examples per class (length `num_classes`)."""
        return np.bincount(self.y, minlength=self.num_classes)
