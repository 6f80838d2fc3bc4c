"""A run's settings from the command line: the flags and --set resolved against the defaults
(or the run to resume), every value, the results directory, the checkpoint and the data checked
before anything starts; and how the run is followed (Watch)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pollen.core import runconfig, rundir
from pollen.core import settings as settings_mod
from pollen.core.dataspec import check_model_fits, data_spec, model_input
from pollen.core.pacing import PROFILES, HeterogeneitySettings, devices
from pollen.core.paths import cache_dir
from pollen.core.protection import DPSettings
from pollen.core.settings import RunSettings, Scalar, SettingsError, SettingsKey, kept, settings_key
from pollen.tools import board, preflight
from pollen.tools.follow import START_TIMEOUT

if TYPE_CHECKING:
    from torch import nn


class NothingToDo(Exception):
    """The command has nothing to do (a resume of a run that already completed every round):
    said in one line, exit 0, nothing started or written."""


RUN_FLAGS = (
    ("algorithm", "algorithm"),
    ("dataset", "dataset"),
    ("clients", "num-clients"),
    ("rounds", "num-rounds"),
)
"""Flags that set a run setting: (flag, setting)."""


def resolve_run_settings(
    args: argparse.Namespace, local: bool = True, require_all: bool = True
) -> dict[str, Scalar]:
    """Settings of a new or resumed run, every value checked before anything starts, and the
    results directory checked (and, for a resume, its checkpoint) before anything is written.
    `local`: the clients run on this machine (deploy, simulate), so its devices count.
    `require_all`: min-available-clients defaults to every client; otherwise to the setting's
    own default (the run waits for every client, but starts without those seen to be lost:
    server.engine.Engine.wait_for_clients)."""
    _check_tensorboard(getattr(args, "tensorboard", None))
    overrides: dict[str, Any] = settings_mod.parse_assignments(args.set)
    declared = runconfig.all_settings()
    for flag, key in RUN_FLAGS:
        value = getattr(args, flag)
        if value is None:
            continue
        if key in overrides and key in declared:
            given = declared[key].coerce(overrides[key])
            if given != declared[key].coerce(value):
                raise SettingsError(
                    f"--{flag} {value} and --set {key}={overrides[key]} disagree: give one"
                )
        overrides[key] = value
    base: dict[str, Any] = {}
    if args.resume:
        if not args.out:
            raise SettingsError("--resume needs --out DIR, the directory of the run to continue")
        saved = Path(args.out) / rundir.CONFIG
        if not saved.is_file():
            raise SettingsError(f"--resume: {saved} not found (nothing to resume)")
        try:
            base = json.loads(saved.read_text())
        except (OSError, ValueError) as exc:
            raise SettingsError(f"--resume: {saved} is unreadable ({exc})") from None
        overrides["resume"] = True
    else:
        overrides.setdefault("resume", False)
    resolved = runconfig.resolve(overrides, base)
    run = RunSettings.of(resolved)
    foreign = runconfig.foreign_settings(run.algorithm, overrides)
    for key, owners in foreign.items():
        raise SettingsError(
            f"setting '{key}' is not read by {run.algorithm}; it belongs to {', '.join(owners)}"
        )
    if local:
        _check_device(run.device)
    out = (
        Path(args.out)
        if args.out
        else Path("results") / (f"{run.algorithm}-{run.dataset}-{time.strftime('%Y%m%d-%H%M%S')}")
    )
    preflight.check_writable_dir(out, "--out")
    preflight.check_free_space(out, "--out")
    if not args.resume and (out / rundir.CHECKPOINT).exists():
        raise SettingsError(
            f"{out} already holds a run; pass --resume to continue it or choose another --out"
        )
    resolved["out-dir"] = str(out.resolve())
    if not run.run_name:
        resolved["run-name"] = f"{out.name}-{int(time.time())}"
    given = "min-available-clients" in overrides or "min-available-clients" in base
    if require_all and not given:
        resolved["min-available-clients"] = run.num_clients
    if args.resume:
        _check_resumable(out, resolved)
    _check_devices(resolved)
    _check_data(resolved)
    return resolved


def _check_devices(resolved: dict[str, Scalar]) -> None:
    """A device CSV (heterogeneity.profile) read now, so that a bad one is one line before
    anything starts, and named by its absolute path: the ServerApp reads it from another
    working directory."""
    het = HeterogeneitySettings.of(resolved)
    if het.profile in PROFILES:
        return
    resolved["heterogeneity.profile"] = str(Path(het.profile).expanduser().resolve())
    run = RunSettings.of(resolved)
    devices(resolved, run.num_clients, run.seed)


@dataclasses.dataclass(frozen=True)
class Watch:
    """How a run is followed: the progress view and the TensorBoard directory."""

    plain: bool | None = None
    """True: plain lines; None: plain unless the output is a terminal (pollen.tools.progress)."""
    tensorboard: Path | None = None
    """TensorBoard writes to this directory's subdirectory named after the results one."""
    start_timeout: float = START_TIMEOUT
    """Seconds the ServerApp may take to start (pollen.tools.follow.follow)."""

    @classmethod
    def of(cls, args: argparse.Namespace) -> Watch:
        board = getattr(args, "tensorboard", None)
        start = getattr(args, "start_timeout", START_TIMEOUT)
        return cls(
            plain=True if getattr(args, "plain", False) else None,
            tensorboard=Path(board) if board else None,
            start_timeout=start,
        )


def _check_tensorboard(directory: str | None) -> None:
    """`--tensorboard DIR`: the package is installed and DIR can be written, before anything
    starts."""
    if not directory:
        return
    reason = board.missing()
    if reason is not None:
        raise SettingsError(reason)
    preflight.check_writable_dir(Path(directory), "--tensorboard")


def _check_device(device: str) -> None:
    """A CUDA device asked for must exist here (`auto` takes CUDA only when there is one)."""
    if not device.startswith("cuda"):
        return
    import torch  # lazy: torch

    if not torch.cuda.is_available():
        raise SettingsError(
            f"device={device}: torch sees no CUDA GPU on this machine; use device=auto or cpu"
        )


def _check_resumable(out: Path, resolved: dict[str, Scalar]) -> None:
    """The checkpoint to resume from is whole and was written with these settings: the checks
    the ServerApp makes, made before anything starts."""
    from server import checkpoint  # lazy: only on this path (--resume)

    try:
        saved = checkpoint.load(out)
        checkpoint.check_compatible(saved.settings, resolved)
    except checkpoint.CheckpointError as exc:
        raise SettingsError(f"--resume: {exc}") from None
    rounds = RunSettings.of(resolved).num_rounds
    if saved.server_round >= rounds and rundir.completed(out):
        raise NothingToDo(
            f"the run in {out} already completed its {rounds} rounds; nothing to resume "
            f"(to train further, resume it with --rounds above {rounds})"
        )


def _check_data(resolved: dict[str, Scalar]) -> None:
    """Dataset and partition parameters are checked, the partition cached and the model built
    (it fits the data; its bytes weighed for the packing) up front. A launcher that has not
    imported torch does this in a child process (`check_data_apart`), so that it does not hold
    torch, the model and the partition, about 0.5 GB, for as long as the run lasts
    (docs/performance.md#settings-that-change-these-figures); one that has (a program or a test
    that calls the command line in its own process) does it here: there is nothing to save."""
    weighed = check_data(resolved) if "torch" in sys.modules else check_data_apart(resolved)
    kept(_MODEL_BYTES, settings_key(resolved), lambda: weighed)


def check_data(resolved: dict[str, Scalar]) -> int:
    """`_check_data` in this process: the bytes of the run's model weights, or SettingsError."""
    from federated_data import (  # lazy: heavy data code
        DataConfigError,
        load_client_data,
        validate_spec,
    )

    try:
        spec = data_spec(resolved)
        validate_spec(spec)
        check_model_fits(resolved)
        model = _built_model(resolved)  # it fits the data
        if DPSettings.of(resolved).enabled:
            from models.privacy import dp_compatible  # lazy: opacus

            dp_compatible(model)  # Opacus can train it (BatchNorm -> GroupNorm), or one line
        load_client_data(spec, 0, cache_dir(resolved))
    except (DataConfigError, ValueError) as exc:
        raise SettingsError(str(exc)) from None
    return _weighed(model)


def check_data_apart(resolved: dict[str, Scalar]) -> int:
    """`check_data` in a child process (pollen.tools.cli.datacheck), the settings sent as JSON
    on its standard input and its answer read from its standard output: the model's bytes, or
    SettingsError with the child's one line (or, should the child die, the last line it wrote).
    What else the child wrote to its standard error (a library's warning) is passed on."""
    done = subprocess.run(
        [sys.executable, "-m", "pollen.tools.cli.datacheck"],
        input=json.dumps(resolved),
        capture_output=True,
        text=True,
        check=False,
    )
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise SettingsError(
            f"checking the data and the model failed (exit code {done.returncode}): {last}"
        ) from None
    if done.stderr:
        sys.stderr.write(done.stderr)
    if "error" in answer:
        raise SettingsError(str(answer["error"]))
    return int(answer["model-bytes"])


def _built_model(resolved: dict[str, Scalar]) -> nn.Module:
    """The run's model (setting model) as the data's shape and classes build it."""
    from models import build_model  # lazy: torch

    shape, classes = model_input(resolved)
    return build_model(RunSettings.of(resolved).model, shape, classes)


_MODEL_BYTES: dict[SettingsKey, int] = {}
"""The bytes of the run's model weights by its settings, weighed when `_check_data` builds it."""


def model_bytes(resolved: dict[str, Scalar]) -> int:
    """The bytes of the run's model weights (its state dict), as a message carries them: those
    `_check_data` weighed for these settings, else the model built again."""
    return kept(_MODEL_BYTES, settings_key(resolved), lambda: _weighed(_built_model(resolved)))


def _weighed(model: nn.Module) -> int:
    return sum(int(t.numel()) * t.element_size() for t in model.state_dict().values())


def one_client_per_node(run: RunSettings) -> None:
    if run.simulation_nodes:
        raise SettingsError(
            f"simulation-nodes={run.simulation_nodes} packs clients onto simulated SuperNodes "
            "(pollen simulate); a deployed SuperNode serves one client: set it to 0"
        )
