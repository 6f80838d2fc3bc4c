"""Cache files that many processes may write at once: whole files appear atomically.

Clients on one machine start in parallel and may all find the cache empty; a writer writes to
a temporary file in the target directory and renames it into place, so a reader sees either
no file or a complete one, never a partial one.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

TMP_PREFIX = ".tmp-"


def default_cache_dir() -> Path:
    """`$POLLEN_CACHE_DIR` if set, else `~/.cache/pollen`."""
    env = os.environ.get("POLLEN_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "pollen"


@contextlib.contextmanager
def _atomic_file(target: Path) -> Iterator[IO[bytes]]:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, suffix=target.suffix, dir=target.parent)
    try:
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide the cache from other users
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def save_npz_atomic(target: Path, arrays: Mapping[str, Any]) -> None:
    """Write an uncompressed .npz (fast to read back) that appears all at once."""
    with _atomic_file(target) as handle:
        np.savez(handle, allow_pickle=False, **arrays)


def write_text_atomic(target: Path, text: str) -> None:
    with _atomic_file(target) as handle:
        handle.write(text.encode("utf-8"))


def remove_stale_temporaries(directory: Path) -> None:
    """Drop temporary files left by writers that died; call only while holding the lock."""
    for leftover in directory.glob(TMP_PREFIX + "*"):
        with contextlib.suppress(OSError):
            leftover.unlink()


@contextlib.contextmanager
def exclusive_lock(directory: Path) -> Iterator[None]:
    """Hold an exclusive lock on `directory` so that one process builds while others wait.

    Where `fcntl` is missing the lock is a no-op: concurrent builders then do duplicate work
    but, writing identical files atomically, still leave a consistent cache.
    """
    directory.mkdir(parents=True, exist_ok=True)
    if fcntl is None:  # pragma: no cover - not POSIX
        yield
        return
    with open(directory / ".lock", "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
