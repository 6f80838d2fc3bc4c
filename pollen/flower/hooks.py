"""A Pollen strategy's round driven by Flower's hooks, one exchange at a time.

Flower's `Strategy.start` calls `configure_train`, sends the messages it returns, and hands the
replies to `aggregate_train`; Pollen's server halves (strategies/) write a round as one call,
`run_round`, that asks the engine for each exchange. Here that call runs in a thread of its own
and stops at its exchange: `configure` returns the exchange's instructions as Flower's
messages, and `aggregate` gives the thread the replies, checked as the engine checks every
reply (server.checks), and returns the round's metrics once the call has finished. Clients are
greeted and sampled by the engine's own code (server.engine), so the same seed samples the same
clients as `start`.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
from flwr.app import Message, RecordDict
from flwr.serverapp import Grid

from pollen.core import protocol
from pollen.core.settings import RunSettings, Scalar
from pollen.flower.wire import with_settings
from server.engine import Engine
from server.exchange import message
from server.results import ResultsWriter
from strategies.base import Fold, Strategy, Validator, same_arrays

log = logging.getLogger("flwr.pollen")


class StepEngine(Engine):
    """The engine with its exchanges handed to Flower's hooks (module docstring)."""

    def __init__(
        self,
        grid: Grid,
        settings: Mapping[str, Scalar],
        strategy: Strategy,
        results: ResultsWriter,
    ) -> None:
        super().__init__(grid, settings, strategy, results)
        self.sends: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.replies: queue.Queue[list[Message]] = queue.Queue()

    def exchange(
        self,
        message_type: str,
        payloads: Mapping[int, RecordDict],
        validate: Validator | None = None,
        min_replies: int | None = None,
        fold: Fold | None = None,
    ) -> dict[int, RecordDict]:
        if not payloads:
            return {}
        self.sends.put(("send", (message_type, dict(payloads))))
        replies = self.replies.get()
        cid_of = {c.node_id: c.cid for c in self.roster.clients.values()}
        good: dict[int, RecordDict] = {}
        failures: dict[int, str] = {}
        for reply in replies:
            cid = cid_of.get(reply.metadata.src_node_id)
            if cid is None or cid not in payloads:
                continue
            if reply.has_error():
                failures[cid] = f"error reply: {reply.error.reason}"
                continue
            why = self.screen(reply.content, message_type, cid, validate)
            if why is None:
                good[cid] = reply.content
            else:
                log.warning("round %s: client %s's reply skipped: %s", self.server_round, cid, why)
                failures[cid] = why
        answered: dict[int, RecordDict] = {}
        for cid in sorted(good):
            if fold is not None:
                fold(cid, good[cid])
                answered[cid] = protocol.without_arrays(good[cid])
            else:
                answered[cid] = good[cid]
        self.require(message_type, len(answered), len(payloads), failures, min_replies)
        return answered


class HookRounds:
    """The rounds of one server half (strategies/) for Flower's hooks (module docstring)."""

    def __init__(self, half: Strategy, settings: Mapping[str, Scalar], out_dir: str) -> None:
        self.half = half
        self.settings = dict(settings)
        self.out_dir = out_dir
        self.engine: StepEngine | None = None
        self._done: dict[str, float] | None = None
        self._thread: threading.Thread | None = None

    def configure(
        self,
        grid: Grid,
        server_round: int,
        arrays: Mapping[str, np.ndarray] | None,
        kind: str,
    ) -> list[Message]:
        """The instructions of the exchange of `kind` ("train": the round's, "evaluate": the
        evaluation of the current model) of `server_round`, settings attached."""
        engine = self._engine(grid, arrays)
        engine.grid = grid
        engine.server_round = server_round
        engine.discover()
        half = self.half
        work: Callable[[], dict[str, float]] = (
            (lambda: half.run_round(engine)) if kind == "train" else (lambda: half.finalize(engine))
        )

        def run() -> None:
            try:
                engine.sends.put(("done", work()))
            except BaseException as exc:  # handed to the caller's thread
                engine.sends.put(("error", exc))

        self._done = None
        self._thread = threading.Thread(target=run, name=f"pollen-{kind}", daemon=True)
        self._thread.start()
        what, value = engine.sends.get()
        if what == "done":  # nobody to ask (an empty sample)
            self._done = dict(value)
            return []
        if what == "error":
            raise value
        message_type, payloads = value
        messages = []
        clients = engine.roster.clients
        for cid, content in sorted(payloads.items()):
            with_settings(content, self.settings)
            messages.append(message(content, clients[cid].node_id, message_type, server_round))
        return messages

    def aggregate(self, server_round: int, replies: Iterable[Message]) -> dict[str, float]:
        """The exchange's replies to the waiting round; its metrics once it has finished."""
        engine = self.engine
        if self._done is not None or engine is None:
            return self._done or {}
        engine.replies.put(list(replies))
        what, value = engine.sends.get()
        if what == "send":
            raise NotImplementedError(
                f"round {server_round} asked for a second exchange ({value[0]}): Flower's "
                "configure/aggregate pair is one exchange; use start()"
            )
        if what == "error":
            raise value
        return dict(value)

    def _engine(self, grid: Grid, arrays: Mapping[str, np.ndarray] | None) -> StepEngine:
        """The engine, made and its clients awaited at the first call; `arrays` (a Flower
        loop's initial or handed-back arrays) replace the global model when they differ."""
        if self.engine is None:
            self.engine = StepEngine(grid, self.settings, self.half, ResultsWriter(self.out_dir))
            self.half.initialize(RunSettings.of(self.settings).seed)
            if arrays:
                self.half.start_from(arrays)
            self.engine.wait_for_clients()
        elif arrays and not same_arrays(arrays, self.half.global_arrays() or {}):
            self.half.start_from(arrays)
        return self.engine
