"""Per-client state on disk (personal models, mixture weights, optimizer buffers, ledgers).

Flower keeps `Context.state` in SuperNode memory only, so a restart would lose it. Here each
client's state lives in `<root>/<run-name>/client-<id>/` as one file per round, written
atomically. Reading "the state before round r" (not simply the newest file) makes a resumed run
replay a round exactly even when the client had already answered it before the server stopped.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from pollen.core.files import atomic_write_bytes

_META = "__meta__"
_NAME = re.compile(r"^state-(\d{6})\.npz$")
_SECRET = "secret"
_SECRET_BYTES = 32


def private_seed(secret: bytes, text: str) -> int:
    """A seed from a client's secret (StateStore.secret) and `text` (what it seeds): the same
    for the same text, unknown to anyone without the secret."""
    digest = hashlib.sha256(secret + text.encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


class StateError(RuntimeError):
    """A client state file is unreadable; it is reported, never silently replaced."""


class StateStore:
    def __init__(self, directory: str | Path, keep: int = 2) -> None:
        self.dir = Path(directory)
        self.keep = keep

    def _versions(self) -> list[tuple[int, Path]]:
        if not self.dir.is_dir():
            return []
        found = []
        for path in self.dir.iterdir():
            match = _NAME.match(path.name)
            if match:
                found.append((int(match.group(1)), path))
        return sorted(found)

    def save(
        self, server_round: int, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any]
    ) -> None:
        if _META in arrays:
            raise ValueError(f"array name {_META!r} is reserved")
        buf = io.BytesIO()
        payload = dict(arrays)
        payload[_META] = np.frombuffer(json.dumps(dict(meta)).encode(), dtype=np.uint8)
        np.savez(buf, **payload)  # type: ignore[arg-type]
        atomic_write_bytes(self.dir / f"state-{server_round:06d}.npz", buf.getvalue())
        for _, old in self._versions()[: -self.keep]:
            old.unlink(missing_ok=True)

    def load(self, before_round: int) -> tuple[dict[str, np.ndarray], dict[str, Any]] | None:
        """The newest state saved for a round earlier than `before_round`, or None."""
        earlier = [(r, p) for r, p in self._versions() if r < before_round]
        if not earlier:
            return None
        _, path = earlier[-1]
        try:
            with np.load(path, allow_pickle=False) as npz:
                arrays = {k: npz[k] for k in npz.files if k != _META}
                meta = json.loads(npz[_META].tobytes().decode()) if _META in npz.files else {}
        except (OSError, ValueError, KeyError, zipfile.BadZipFile, json.JSONDecodeError) as exc:
            raise StateError(
                f"client state file {path} is unreadable ({exc}); move it away to start this "
                "client afresh, or restore it from a backup"
            ) from None
        return arrays, meta

    def secret(self) -> bytes:
        """This client's secret: 32 random bytes drawn from the operating system the first time
        it is asked for and kept beside the state files (readable by the client's user only),
        never sent. Noise drawn from it (client.env.ClientEnv.private_seed) is unknown to
        anyone else, yet the same when a round is answered twice (an instruction sent again,
        a round replayed after a restart), so a repeated reply releases nothing new."""
        path = self.dir / _SECRET
        if not path.exists():
            self.dir.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            except FileExistsError:  # another process of this client made it first
                pass
            else:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(os.urandom(_SECRET_BYTES))
                    fh.flush()
                    os.fsync(fh.fileno())
        data = path.read_bytes()
        if len(data) != _SECRET_BYTES:
            raise StateError(
                f"client secret {path} holds {len(data)} bytes, not {_SECRET_BYTES}; move it away "
                "to draw a new one (the client's private noise then changes)"
            )
        return data
