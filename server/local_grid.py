"""A Grid inside one process: every message goes straight to a ClientApp object, one node per
client, and its reply comes back at once. It runs the real ServerApp and ClientApp without
SuperLink, SuperNodes or transport: for experiments that run many small federations
(experiments/robustness.py) and for tests, which add fault injection (tests/fakes.py)."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

FIRST_NODE = 100
"""Node ids are FIRST_NODE + partition id."""


class LocalGrid(Grid):
    def __init__(
        self,
        client_app: ClientApp,
        num_nodes: int,
        run_config: dict[str, Any],
        node_config: dict[str, Any] | None = None,
    ) -> None:
        self.client_app = client_app
        self.run_config = run_config
        self._replies: dict[str, Message] = {}
        self.contexts: dict[int, Context] = {}
        for i in range(num_nodes):
            self.add_node(FIRST_NODE + i, i, num_nodes, node_config or {})

    def add_node(self, node_id: int, partition: int, num: int, extra: dict[str, Any]) -> None:
        self.contexts[node_id] = Context(
            run_id=1,
            node_id=node_id,
            node_config={"partition-id": partition, "num-partitions": num, **extra},
            state=RecordDict(),
            run_config=dict(self.run_config),
        )

    def remove_node(self, node_id: int) -> None:
        self.contexts.pop(node_id)

    def set_run(self, run_id: Any) -> None:
        self._run_id = run_id

    @property
    def run(self) -> Any:
        return None

    def create_message(
        self,
        content: RecordDict,
        message_type: str,
        dst_node_id: int,
        group_id: str,
        ttl: float | None = None,
    ) -> Message:
        return Message(
            content, dst_node_id=dst_node_id, message_type=message_type, group_id=group_id, ttl=ttl
        )

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def get_nodes(self) -> Iterable[Any]:
        return []

    def deliver(self, msg: Message) -> Message:
        """The node's reply to `msg` (the ClientApp called on a copy, as a transport would)."""
        reply: Message = self.client_app(
            copy.deepcopy(msg), self.contexts[msg.metadata.dst_node_id]
        )
        return reply

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = uuid.uuid4().hex
            ids.append(msg.metadata.message_id)
            if msg.metadata.dst_node_id in self.contexts:
                self._replies[msg.metadata.message_id] = self.deliver(msg)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        return [self._replies.pop(i) for i in list(message_ids) if i in self._replies]

    def send_and_receive(
        self, messages: Iterable[Message], *, timeout: float | None = None
    ) -> Iterable[Message]:
        return self.pull_messages(self.push_messages(messages))


@contextmanager
def task_identity() -> Iterator[None]:
    """Flower's task identity set for the length of an in-process run (messages are built
    outside a real run's task)."""
    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)  # type: ignore[attr-defined]
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 1
    try:
        yield
    finally:
        TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved  # type: ignore[attr-defined]
