"""Cache files that many processes may write at once: whole files appear atomically.

Clients on one machine start in parallel and may all find the cache empty; a writer writes to
a temporary file in the target directory and renames it into place, so a reader sees either
no file or a complete one, never a partial one.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import re
import tempfile
import zipfile
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


def load_npz(path: Path) -> dict[str, np.ndarray]:
    """Every array of a small .npz that `save_npz_atomic` wrote, as np.load(allow_pickle=False)
    reads it (each array writable, owning its memory), about three times faster for a client's
    partition file: each member is read whole and its .npy header parsed without numpy's
    literal_eval. A header of any other form goes to numpy's reader. A damaged file raises what
    reading it with np.load can raise (OSError, ValueError, EOFError, zipfile.BadZipFile)."""
    with zipfile.ZipFile(path) as archive:
        return {
            info.filename.removesuffix(".npy"): _npy(archive.read(info))
            for info in archive.infolist()
        }


_NPY_HEADER = re.compile(
    rb"\{'descr': '([<>|=][biuf]\d+)', 'fortran_order': (False|True), "
    rb"'shape': \(([\d, ]*)\), \} *\n"
)
"""The header np.save writes for a plain numeric array (format versions 1 to 3)."""


def _npy(data: bytes) -> np.ndarray:
    """The array of one .npy file's bytes."""
    if data[:6] == b"\x93NUMPY" and data[6:7] in (b"\x01", b"\x02", b"\x03"):
        start = 10 if data[6] == 1 else 12
        end = start + int.from_bytes(data[8:start], "little")
        header = _NPY_HEADER.fullmatch(data, start, end)
        if header is not None:
            shape = tuple(int(n) for n in header[3].split(b",") if n.strip())
            flat = np.frombuffer(data, np.dtype(header[1].decode()), math.prod(shape), end)
            return flat.copy().reshape(shape, order="F" if header[2] == b"True" else "C")
    return np.lib.format.read_array(io.BytesIO(data), allow_pickle=False)  # type: ignore[no-any-return]


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
