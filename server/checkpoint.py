"""Server checkpoints: strategy state, engine RNG and round, written atomically after each round.

`checkpoint/` holds `state.npz` and `state.json`; the JSON records the npz's SHA-256 so a
truncated or altered file is detected rather than loaded. A new checkpoint is built in a
temporary directory and swapped in by rename; the previous one stays until the swap is done.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pollen.core.files import atomic_write_bytes
from pollen.core.runconfig import all_settings
from pollen.core.rundir import CHECKPOINT

FORMAT_VERSION = 1


class CheckpointError(RuntimeError):
    """A checkpoint is missing, corrupt or belongs to a different run."""


@dataclass(frozen=True)
class Checkpoint:
    server_round: int
    arrays: dict[str, np.ndarray]
    strategy_meta: dict[str, Any]
    rng_state: dict[str, Any]
    settings: dict[str, Any]
    time: float = 0.0
    """The run's time at the end of the round (RoundRow.time): a resumed run counts on."""


def save(out_dir: Path, ckpt: Checkpoint) -> None:
    final = out_dir / CHECKPOINT
    tmp = out_dir / f"{CHECKPOINT}.tmp"
    prev = out_dir / f"{CHECKPOINT}.prev"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    buf = io.BytesIO()
    np.savez(buf, **ckpt.arrays)  # type: ignore[arg-type]
    blob = buf.getvalue()
    atomic_write_bytes(tmp / "state.npz", blob)
    meta = {
        "format": FORMAT_VERSION,
        "round": ckpt.server_round,
        "strategy": ckpt.strategy_meta,
        "rng": ckpt.rng_state,
        "settings": ckpt.settings,
        "time": ckpt.time,
        "npz-sha256": hashlib.sha256(blob).hexdigest(),
    }
    atomic_write_bytes(tmp / "state.json", json.dumps(meta, sort_keys=True).encode())
    if final.exists():
        shutil.rmtree(prev, ignore_errors=True)
        final.rename(prev)
    tmp.rename(final)
    shutil.rmtree(prev, ignore_errors=True)


def load(out_dir: Path) -> Checkpoint:
    """The latest complete checkpoint in `out_dir`."""
    for candidate in (out_dir / CHECKPOINT, out_dir / f"{CHECKPOINT}.prev"):
        if candidate.is_dir():
            return _read(candidate)
    raise CheckpointError(f"no checkpoint in {out_dir} (nothing to resume)")


def _read(path: Path) -> Checkpoint:
    json_path, npz_path = path / "state.json", path / "state.npz"
    try:
        meta = json.loads(json_path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} has no state.json") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"checkpoint file {json_path} is corrupt: {exc}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint file {json_path} has an unknown format")
    try:
        blob = npz_path.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} has no state.npz") from None
    if hashlib.sha256(blob).hexdigest() != meta.get("npz-sha256"):
        raise CheckpointError(
            f"checkpoint file {npz_path} does not match its recorded checksum "
            "(truncated or modified); refusing to resume from it"
        )
    try:
        with np.load(io.BytesIO(blob), allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except (ValueError, OSError, zipfile.BadZipFile) as exc:
        raise CheckpointError(f"checkpoint file {npz_path} is unreadable: {exc}") from None
    try:
        return Checkpoint(
            server_round=int(meta["round"]),
            arrays=arrays,
            strategy_meta=dict(meta["strategy"]),
            rng_state=dict(meta["rng"]),
            settings=dict(meta["settings"]),
            time=float(meta.get("time", 0.0)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"checkpoint file {json_path} lacks a field: {exc}") from None


# Settings that may differ between the interrupted run and its resumption.
RESUMABLE_CHANGES = frozenset(
    {
        "num-rounds",
        "resume",
        "phase-timeout",
        "resend-limit",
        "poll-interval",
        "wait-for-clients",
        "out-dir",
        "data-dir",
        "cache-dir",
        "client-state-dir",
        "device",
        "final-eval",
        "simulation-nodes",
        "round.deadline",
    }
)


def check_compatible(saved: Mapping[str, Any], current: Mapping[str, Any]) -> None:
    """A setting added to Pollen after the checkpoint was written counts as unchanged when the
    resumed run keeps its default (the behaviour the saved run had)."""
    declared = all_settings()

    def before(key: str) -> Any:
        if key in saved or key not in declared:
            return saved.get(key)
        return declared[key].default

    changed = sorted(
        k
        for k in set(saved) | set(current)
        if k not in RESUMABLE_CHANGES and before(k) != current.get(k)
    )
    if changed:
        detail = ", ".join(f"{k}: {before(k)!r} -> {current.get(k)!r}" for k in changed)
        raise CheckpointError(f"cannot resume: settings differ from the checkpoint ({detail})")
