"""Fixtures of the operator-facing tests."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port another program listens on, on every interface (as on a real server)."""
    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen()
        yield held.getsockname()[1]
