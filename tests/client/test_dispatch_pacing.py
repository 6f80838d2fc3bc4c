"""A client's device on the wall clock (client.dispatch.wait_out): what the reply says its
device adds is waited out by the process that hands the reply over, the longest of a packed
reply's clients; nothing at all without devices or on the virtual clock."""

from __future__ import annotations

from flwr.app import RecordDict

from client.dispatch import wait_out
from pollen.core import protocol
from pollen.core.runconfig import resolve

WALL = resolve({"heterogeneity.profile": "tiers", "heterogeneity.clock": "wall"})


def _reply(wait: float | None) -> RecordDict:
    metrics = {} if wait is None else {protocol.DEVICE_WAIT: wait}
    return protocol.reply(protocol.instruction(1, "train"), 0, metrics)


def test_the_wait_the_reply_names_is_waited_out() -> None:
    slept: list[float] = []
    assert wait_out(_reply(2.5), WALL, slept.append) == 2.5
    assert slept == [2.5]


def test_a_packed_reply_waits_for_its_slowest_device() -> None:
    slept: list[float] = []
    packed = protocol.pack({0: _reply(1.0), 1: _reply(4.0), 2: _reply(None)})
    assert wait_out(packed, WALL, slept.append) == 4.0
    assert slept == [4.0]


def test_no_wait_without_devices_or_on_the_virtual_clock() -> None:
    slept: list[float] = []
    virtual = resolve({"heterogeneity.profile": "tiers", "heterogeneity.clock": "virtual"})
    for settings in (resolve({}), virtual):
        assert wait_out(_reply(3.0), settings, slept.append) == 0.0
    assert wait_out(_reply(None), WALL, slept.append) == 0.0
    assert slept == []
