"""GPUs and Ray clusters (docs/deployment.md#gpu): the CUDA GPUs torch sees, `pollen simulate
--gpus-per-client` and `--ray-address`, `pollen deploy --gpus` and `pollen client --gpu`, and a
SuperNode's CUDA_VISIBLE_DEVICES, each checked before anything starts."""

from __future__ import annotations

import os
from collections.abc import Sequence

from pollen.core.settings import SettingsError
from pollen.tools.cli.checks import host_port
from pollen.tools.processes import LaunchError


def cuda_devices() -> int:
    """How many CUDA GPUs torch sees on this machine (0 without CUDA)."""
    import torch  # lazy: torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def simulation_gpus(per_client: float, device: str, on_cluster: bool) -> int | None:
    """Checks `--gpus-per-client` against the run's device and this machine's GPUs before
    anything starts; returns the GPUs the local Ray instance is to offer (None: on a cluster,
    or none asked for)."""
    if not per_client >= 0 or per_client == float("inf"):
        raise SettingsError(f"--gpus-per-client must be 0 or more, not {per_client:g}")
    if per_client == 0:
        if device == "cuda":
            raise SettingsError(
                "device=cuda in simulation needs --gpus-per-client above 0: Ray hides the GPUs "
                "from clients that reserve none"
            )
        return None
    if device == "cpu":
        raise SettingsError(
            f"--gpus-per-client {per_client:g} with device=cpu: the clients would reserve GPUs "
            "and not use them; use device=auto or cuda, or drop --gpus-per-client"
        )
    if per_client > 1 and not float(per_client).is_integer():
        raise SettingsError(
            f"--gpus-per-client {per_client:g}: Ray takes a fraction of one GPU or a whole "
            "number of GPUs per client"
        )
    if on_cluster:
        return None
    count = cuda_devices()
    if count == 0:
        raise SettingsError(
            f"--gpus-per-client {per_client:g}: torch sees no CUDA GPU on this machine "
            "(drop the option to train on the CPU, or --ray-address a cluster with GPUs)"
        )
    if per_client > count:
        raise SettingsError(
            f"--gpus-per-client {per_client:g}: this machine has {count} CUDA GPU"
            f"{'s' if count > 1 else ''}"
        )
    return count


def ray_cluster(given: str | None) -> str | None:
    """The Ray cluster a simulation joins: --ray-address, else RAY_ADDRESS from the
    environment (Ray's own variable), as the GCS address HOST:PORT of the cluster's head; it
    must answer. RAY_ADDRESS=auto (Ray's: the cluster `ray start` runs on this machine) is
    passed on as it is. None: a Ray instance of the simulation's own."""
    address = given if given is not None else os.environ.get("RAY_ADDRESS", "")
    option = "--ray-address" if given is not None else "RAY_ADDRESS"
    if given is None and address in ("", "local"):
        return None
    if given is None and address == "auto":
        return address
    try:
        if "://" in address:  # ray:// is Ray Client's port, not the cluster's GCS address
            raise LaunchError(address)
        host, port = host_port(address, option)
    except LaunchError:
        raise SettingsError(
            f"{option} {address!r} is not HOST:PORT, the address of the Ray cluster's head "
            "node (`ray start --head --port PORT` prints it), e.g. 10.0.0.5:6379"
        ) from None
    import socket  # lazy: only on this path

    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError as exc:
        raise LaunchError(
            f"{option} {address}: no Ray cluster answers there ({exc.strerror or exc}); start "
            "one with `ray start --head --port PORT` on its head node"
        ) from None
    return address


def deploy_gpus(text: str | None, device: str) -> list[int]:
    """The CUDA devices of `pollen deploy --gpus 0,1`, checked against the run's device and
    the GPUs torch sees here ([] without the option)."""
    if text is None:
        return []
    try:
        gpus = [int(part) for part in text.split(",")]
    except ValueError:
        raise SettingsError(
            f"--gpus {text!r}: expected GPU indices separated by commas, e.g. 0,1"
        ) from None
    if any(g < 0 for g in gpus) or len(set(gpus)) != len(gpus):
        raise SettingsError(f"--gpus {text}: indices must be distinct and 0 or more")
    if device == "cpu":
        raise SettingsError(
            f"--gpus {text} with device=cpu: the SuperNodes would not use them; use device=auto "
            "or cuda, or drop --gpus"
        )
    check_gpus_present(f"--gpus {text}", max(gpus))
    return gpus


def check_gpus_present(option: str, highest: int) -> None:
    count = cuda_devices()
    if count <= highest:
        seen = (
            "torch sees no CUDA GPU on this machine"
            if count == 0
            else f"torch sees {count} CUDA GPU{'s' if count > 1 else ''} here (0 to {count - 1})"
        )
        raise LaunchError(f"{option}: {seen}")


def gpu_environment(gpus: Sequence[int], index: int) -> dict[str, str]:
    """SuperNode `index`'s CUDA_VISIBLE_DEVICES: the listed GPUs round-robin ({} for none).
    Its ClientApps then see that one GPU as cuda:0."""
    if not gpus:
        return {}
    return {"CUDA_VISIBLE_DEVICES": str(gpus[index % len(gpus)])}
