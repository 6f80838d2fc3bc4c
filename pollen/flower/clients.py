"""An algorithm's client half on a Flower project's own ClientApp, training the project's own
model on its own data (docs/flower-apps.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from client.dispatch import answer_node, wait_out
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
        reply = answer_node(msg.metadata.message_type, content, env)
        wait_out(reply, settings)
        return Message(reply, reply_to=msg)

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


Split = Any
"""One split as `client_data` takes it: an (examples, labels) pair of NumPy arrays or torch
tensors, or a PyTorch DataLoader or Dataset whose items are (example, label) pairs or dicts
with one image and one label key (Flower's quickstarts: `{"img": ..., "label": ...}`)."""

IMAGE_KEYS = ("img", "image", "images", "x", "pixel_values", "features")
LABEL_KEYS = ("label", "labels", "y", "target", "fine_label")


def client_data(
    train: Split,
    test: Split,
    num_classes: int,
    val: Split | None = None,
) -> ClientData:
    """A client's splits. Each is an (examples, labels) pair of NumPy arrays or torch tensors
    (images as uint8 (N, C, H, W) or float32; labels integers in [0, num_classes)), or a
    DataLoader or Dataset yielding such pairs or dicts such as `{"img": x, "label": y}`: its
    examples are read once, in its dataset's order (its transforms applied), and Pollen's
    clients batch and shuffle them by the strategy's `batch-size` (docs/flower-apps.md)."""
    from federated_data import ArrayDataset, ClientData  # lazy: data code

    def split(given: Split, name: str) -> ArrayDataset:
        x, y = _pair(given, name)
        if x.dtype != np.uint8:
            x = x.astype(np.float32)
        return ArrayDataset(np.array(x, order="C"), np.asarray(y, dtype=np.int64), num_classes)

    train_split = split(train, "train")
    if val is None:
        empty = np.zeros((0, *train_split.x.shape[1:]), train_split.x.dtype)
        val_split = ArrayDataset(empty, np.zeros(0, np.int64), num_classes)
    else:
        val_split = split(val, "val")
    # the client id is the node's partition id, set when the data is loaded (client.env)
    return ClientData(0, train_split, val_split, split(test, "test"))


def _pair(given: Split, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(examples, labels) of one split as NumPy arrays; SettingsError naming what it got."""
    if isinstance(given, tuple | list) and len(given) == 2:
        return _numpy(given[0]), _numpy(given[1]).reshape(-1)
    if _is_loader(given):
        return _read(_in_order(given), name)
    if hasattr(given, "__getitem__") and hasattr(given, "__len__"):  # a Dataset
        return _read(_loader(given), name)
    raise SettingsError(
        f"client_data: {name} is a {type(given).__name__}; give an (examples, labels) pair, "
        "a DataLoader or a Dataset"
    )


def _is_loader(obj: Any) -> bool:
    from torch.utils.data import DataLoader  # lazy: torch

    return isinstance(obj, DataLoader)


def _in_order(loader: Any) -> Any:
    """The loader's examples in its dataset's order: a shuffling loader (Flower's quickstart
    shuffles its training split) would hand them over in a new order in every process, and
    Pollen's seeded batching of them would then differ from run to run."""
    from torch.utils.data import DataLoader, RandomSampler  # lazy: torch

    if not isinstance(loader.sampler, RandomSampler):
        return loader
    return DataLoader(
        loader.dataset, batch_size=loader.batch_size or 256, shuffle=False,
        collate_fn=loader.collate_fn,
    )  # fmt: skip


def _loader(dataset: Any) -> Any:
    from torch.utils.data import DataLoader  # lazy: torch

    return DataLoader(dataset, batch_size=256, shuffle=False)


def _read(loader: Any, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Every (example, label) a DataLoader yields, in its order."""
    xs: list[np.ndarray] = []
    ys: list[np.ndarray] = []
    for batch in loader:
        if isinstance(batch, dict):
            x = next((batch[k] for k in IMAGE_KEYS if k in batch), None)
            y = next((batch[k] for k in LABEL_KEYS if k in batch), None)
            if x is None or y is None:
                raise SettingsError(
                    f"client_data: {name}'s batches are dicts with keys {sorted(batch)}; "
                    f"expected one of {', '.join(IMAGE_KEYS)} and one of {', '.join(LABEL_KEYS)}"
                )
        elif isinstance(batch, tuple | list) and len(batch) == 2:
            x, y = batch
        else:
            raise SettingsError(
                f"client_data: {name}'s batches are {type(batch).__name__}s; expected "
                "(examples, labels) pairs or dicts such as {'img': ..., 'label': ...}"
            )
        xs.append(_numpy(x))
        ys.append(_numpy(y).reshape(-1))
    if not xs:
        raise SettingsError(f"client_data: {name}'s DataLoader yields no examples")
    return np.concatenate(xs), np.concatenate(ys)


def _numpy(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):
        return np.asarray(value.detach().cpu().numpy())
    return np.asarray(value)
