"""client.env's process set-up for simulation workers."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
from flwr.app import Array

from client import env
from pollen.core import protocol


def _fake_ray(initialized: bool, calls: list[tuple[Any, ...]]) -> types.ModuleType:
    ray = types.ModuleType("ray")
    ray.is_initialized = lambda: initialized  # type: ignore[attr-defined]
    ray.util = types.SimpleNamespace(  # type: ignore[attr-defined]
        register_serializer=lambda cls, *, serializer, deserializer: calls.append(
            (cls, serializer, deserializer)
        )
    )
    return ray


def test_a_ray_worker_hands_arrays_to_ray_out_of_band_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """In a process where Ray runs, Arrays are registered once with protocol's out-of-band
    fields; where Ray is not loaded, or not started, nothing is registered."""
    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(env, "_out_of_band", False)
    monkeypatch.delitem(sys.modules, "ray", raising=False)
    env.pass_arrays_out_of_band()
    monkeypatch.setitem(sys.modules, "ray", _fake_ray(False, calls))
    env.pass_arrays_out_of_band()
    assert calls == []
    monkeypatch.setitem(sys.modules, "ray", _fake_ray(True, calls))
    env.pass_arrays_out_of_band()
    env.pass_arrays_out_of_band()
    assert calls == [(Array, protocol.array_fields, protocol.array_of_fields)]
