"""An algorithm's client half on a Flower project's own ClientApp, training the project's own
model on its own data (docs/flower-apps.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from client.dispatch import answer_node
from client.env import ClientEnv
from pollen.core.contracts import secagg
from pollen.core.protocol import HELLO
from pollen.core.registry import get_algorithm
from pollen.core.runmodel import DataFn, ModelFn
from pollen.core.settings import RunSettings, SettingsError
from pollen.flower.wire import OWN_MODEL, settings_of

if TYPE_CHECKING:
    from federated_data import ClientData

Handler = Callable[[Message, Context], Message]

def handler(algorithm: str, model_fn: ModelFn | None, data_fn: DataFn | None) -> Handler:
    """The ClientApp function that answers every message type of `algorithm`: the run's
    settings from the instruction (pollen.flower.wire), the node's client id from its
    `partition-id`, then the algorithm's handler as Pollen's own ClientApp runs it
    (client.dispatch), with the user's model and data."""

    def handle(msg: Message, context: Context) -> Message:
        content = msg.content
        settings = settings_of(content)
        theirs = RunSettings.of(settings).algorithm
        if theirs != algorithm:
            raise SettingsError(
                f"this ClientApp runs {algorithm}'s client half, the server {theirs}"
            )
        env = ClientEnv.of_settings(context, settings, model_fn=model_fn, data_fn=data_fn)
        return Message(answer_node(msg.metadata.message_type, content, env), reply_to=msg)

    return handle


def register(
    app: ClientApp,
    algorithm: str,
    model_fn: ModelFn | None = None,
    data_fn: DataFn | None = None,
) -> None:
    """Registers `algorithm`'s client half on `app`: a handler for each of its message types and
    for the hello every node answers. `model_fn()` builds the model its clients train (default:
    the strategy's `model` setting; classifier algorithms only, `OWN_MODEL`); `data_fn(
    partition_id, num_partitions)` loads this node's client's splits as a ClientData
    (`client_data` makes one; default: the strategy's `dataset` setting, partitioned as
    Pollen partitions it). Personal state (FedEM's mixture weights, SCAFFOLD's control
    variate, ADEPT's local models) is kept per client, as in Pollen's own ClientApp. An
    algorithm that takes secure aggregation answers its stages too (`secagg.enabled` on the
    strategy)."""
    spec = get_algorithm(algorithm)
    if model_fn is not None and algorithm not in OWN_MODEL:
        raise SettingsError(
            f"{algorithm} builds its models from its own settings; register it without model_fn"
        )
    handle = handler(algorithm, model_fn, data_fn)
    decorators = {"train": app.train, "evaluate": app.evaluate, "query": app.query}
    stages = secagg.STAGES if spec.secagg else ()  # the stages of secure aggregation
    for message_type in (HELLO, *stages, *spec.message_types):
        category, _, action = message_type.partition(".")
        if action:
            decorators[category](action)(handle)
        else:
            decorators[category]()(handle)


def client_data(
    train: tuple[Any, Any],
    test: tuple[Any, Any],
    num_classes: int,
    val: tuple[Any, Any] | None = None,
) -> ClientData:
    """A client's splits from (examples, labels) pairs of NumPy arrays or torch tensors:
    images as uint8 (N, C, H, W) or float32, labels as integers in [0, num_classes)."""
    from federated_data import ArrayDataset, ClientData  # lazy: data code

    def split(pair: tuple[Any, Any]) -> ArrayDataset:
        x, y = (v.numpy() if hasattr(v, "numpy") else np.asarray(v) for v in pair)
        if x.dtype != np.uint8:
            x = x.astype(np.float32)
        return ArrayDataset(np.array(x, order="C"), np.asarray(y, dtype=np.int64), num_classes)

    empty = (np.zeros((0, *np.shape(train[0])[1:]), np.asarray(train[0]).dtype), np.zeros(0))
    # the client id is the node's partition id, set when the data is loaded (client.env)
    return ClientData(0, split(train), split(val if val is not None else empty), split(test))
