"""What several commands check in the options they are given before anything starts (a
HOST:PORT address, the --attack options), and the warning line for what the operator allowed."""

from __future__ import annotations

import argparse
import math
import sys

from pollen.core.settings import Scalar
from pollen.tools.processes import LaunchError


def warn(text: str) -> None:
    print(f"pollen: warning: {text}", file=sys.stderr, flush=True)


def host_port(address: str, option: str) -> tuple[str, int]:
    """HOST:PORT (IPv6 in brackets), checked before anything starts."""
    host, sep, port = address.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise LaunchError(f"{option} {address!r} is not HOST:PORT (e.g. server.example.org:9092)")
    return host, int(port)


def attack_node_config(args: argparse.Namespace) -> dict[str, Scalar]:
    """The node config of `--attack` (a node that attacks the run, to evaluate robust rules;
    docs/robustness.md#attacks), checked here in one line; {} when none is asked for."""
    kind = getattr(args, "attack", None)
    if not kind:
        return {}
    scale = getattr(args, "attack_scale", 10.0)
    if not math.isfinite(scale) or scale < 0:
        raise LaunchError(f"--attack-scale must be finite and >= 0, not {scale:g}")
    return {"attack": kind, "attack-scale": scale}
