from __future__ import annotations

from server.app import exit_with_parent


def test_the_server_app_exits_once_its_parent_is_gone() -> None:
    parents = iter([10, 10, 10, 1])  # the parent dies: the process is re-parented to init
    exits: list[int] = []
    naps: list[float] = []
    exit_with_parent(getppid=lambda: next(parents), exit_=exits.append, sleep=naps.append)
    assert exits == [1] and len(naps) == 2
