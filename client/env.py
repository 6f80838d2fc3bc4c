"""What a client handler gets: its stable id, the run's settings, its data, state and device.

Built per message from Flower's Context. Data, state and torch are loaded on first use, so a
handler that needs none of them (a no-op probe) costs nothing beyond the import of this module.
"""

from __future__ import annotations

import hashlib
import importlib
import math
import sys
import time
import warnings
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flwr.app import Array, Context, RecordDict

from client.state import StateStore, private_seed
from pollen.core.dataspec import data_spec, partition_of
from pollen.core.paths import cache_dir
from pollen.core.protection import NODE_ATTACKS, AttackSettings
from pollen.core.protocol import array_fields, array_of_fields
from pollen.core.registry import AlgorithmSpec
from pollen.core.runconfig import from_run_config
from pollen.core.runmodel import DataFn, ModelFn
from pollen.core.settings import RunSettings, Scalar

if TYPE_CHECKING:
    import torch

    from federated_data import ClientData, DataSpec


class ClientConfigError(ValueError):
    """The node's configuration does not fit the run."""


@dataclass(frozen=True)
class NodeAttack:
    """A node's own attack (node config `attack`, `attack-scale`, `attack-std`): its clients
    change their training replies (or, label-flip, their labels), as a Byzantine participant
    of a real federation would (docs/robustness.md#attacks)."""

    kind: str
    scale: float = 10.0
    std: float = 1.0


def node_attack(node: Mapping[str, Any]) -> NodeAttack | None:
    """The node's attack from its node config; ClientConfigError names a bad one."""
    kind = node.get("attack")
    if not kind:
        return None
    if kind not in NODE_ATTACKS:
        raise ClientConfigError(
            f"node config attack={kind!r}: a node can run {', '.join(NODE_ATTACKS)} (the other "
            "attacks need the honest clients' updates: simulation only, attack.*)"
        )
    try:
        scale = float(node.get("attack-scale", 10.0))
        std = float(node.get("attack-std", 1.0))
    except (TypeError, ValueError):
        raise ClientConfigError("node config attack-scale / attack-std must be numbers") from None
    if not (math.isfinite(scale) and math.isfinite(std)) or scale < 0 or std < 0:
        raise ClientConfigError("node config attack-scale / attack-std must be finite and >= 0")
    return NodeAttack(str(kind), scale, std)


def flip_labels(data: ClientData) -> ClientData:
    """The client's data with every training label y replaced by C - 1 - y (Biggio et al.,
    ICML 2012's label flipping, in the all-to-all form of the robustness benchmarks); the
    validation and test splits stay true."""
    train = data.train
    flipped = replace(train, y=(train.num_classes - 1 - train.y).astype(train.y.dtype))
    return replace(data, train=flipped)


@dataclass
class ClientEnv:
    cid: int
    settings: Mapping[str, Scalar]
    state_root: Path
    run_name: str
    cache_dir: Path
    data_dir: str | None
    hosted: tuple[int, ...] = ()
    """The clients the node serves: (cid,), or on a simulated node hosting several (setting
    simulation-nodes) all of them, cid being the first."""
    node_attack: NodeAttack | None = None
    """The attack the node's operator asked every client of this node to run (node config
    `attack`), or None."""
    model_fn: ModelFn | None = None
    """The user's model in place of the run's `model` (a Flower app's own, pollen.flower)."""
    data_fn: DataFn | None = None
    """The user's data in place of the run's dataset partition (pollen.flower)."""
    num_partitions: int = 0
    """The node's num-partitions (what `data_fn` is told; 0: the run's num-clients)."""
    secagg_key: str | None = None
    """Node config `secagg-key`: the node's authentication key (`pollen client --auth-key`),
    which signs the keys its clients advertise in secure aggregation."""
    secagg_peers: str | None = None
    """Node config `secagg-peers`: a directory of the registered nodes' public keys (`pollen
    client --peer-keys`): secure aggregation then takes only keys signed by one of them."""
    _extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_context(cls, context: Context) -> ClientEnv:
        """The node's environment: that of its client, or of the first of the clients it hosts
        (`for_client` gives the others')."""
        return cls.of_settings(context, from_run_config(context.run_config))

    @classmethod
    def of_settings(
        cls,
        context: Context,
        cfg: Mapping[str, Scalar],
        model_fn: ModelFn | None = None,
        data_fn: DataFn | None = None,
    ) -> ClientEnv:
        """The node's environment for a run of settings `cfg` (from Flower's run config, or sent
        by the server with each message: pollen.flower), with the user's model and data when
        given."""
        run = RunSettings.of(cfg)
        node = context.node_config
        hosted = hosted_clients(node, run)
        return cls(
            cid=hosted[0],
            hosted=tuple(hosted),
            settings=cfg,
            state_root=_state_root(node, cfg, run),
            run_name=run.run_name or f"run-{context.run_id}",
            cache_dir=_cache_dir(node, cfg),
            data_dir=str(node.get("data-dir") or run.data_dir) or None,
            node_attack=node_attack(node),
            model_fn=model_fn,
            data_fn=data_fn,
            num_partitions=int(node.get("num-partitions", 0) or 0),
            secagg_key=str(node.get("secagg-key") or "") or None,
            secagg_peers=str(node.get("secagg-peers") or "") or None,
        )

    @property
    def packed(self) -> bool:
        """Whether the node answers packed messages (setting simulation-nodes)."""
        return self.run.simulation_nodes > 0

    def for_client(self, cid: int) -> ClientEnv:
        """The environment of another client this node hosts (its own data, state, seeds)."""
        if cid not in self.hosted:
            raise ClientConfigError(f"client {cid} is not one this node hosts")
        env = replace(self, cid=cid, _extra={})
        for shared in ("run", "data_spec"):  # the same for every client of the run
            if shared in self.__dict__:
                env.__dict__[shared] = self.__dict__[shared]
        return env

    @cached_property
    def run(self) -> RunSettings:
        """The run's common settings, typed; an algorithm's own: its contract's SettingsGroup."""
        return RunSettings.of(self.settings)

    @cached_property
    def data_spec(self) -> DataSpec:
        return data_spec(self.settings, self.data_dir)

    @cached_property
    def data(self) -> ClientData:
        from federated_data import load_client_data  # lazy: heavy data code

        started = time.perf_counter()
        if self.data_fn is not None:
            data = own_data(self.data_fn, self.cid, self.num_partitions or self.run.num_clients)
        else:
            part = partition_of(self.settings, self.cid)
            key = (self.data_spec, part, str(self.cache_dir))  # DataSpec: frozen, hashable
            kept = _resident.get(key) if _resident is not None else None
            if kept is None:
                kept = load_client_data(self.data_spec, part, self.cache_dir)
                if _resident is not None:
                    _resident.keep(key, kept)
            data = kept
        self._extra["data-seconds"] = time.perf_counter() - started
        if self.attack == "label-flip":
            data = flip_labels(data)
        return data

    @cached_property
    def attack(self) -> str | None:
        """The attack this client runs itself, for evaluating robust rules
        (docs/robustness.md#attacks): the node's `attack` when its operator set one, or the
        run's label-flip when `attack.clients` names this client (attacks on updates in a
        simulation act at the server's aggregation, strategies.robust); None: honest."""
        if self.node_attack is not None:
            return self.node_attack.kind
        attack = AttackSettings.of(self.settings)
        if attack.kind == "label-flip" and self.cid in attack.ids():
            return "label-flip"
        return None

    @cached_property
    def state(self) -> StateStore:
        return StateStore(self.state_root / self.run_name / f"client-{self.cid}")

    @cached_property
    def device(self) -> torch.device:
        import torch  # lazy: torch

        wanted = self.run.device
        if wanted == "cuda" or (wanted == "auto" and torch.cuda.is_available()):
            return torch.device("cuda")
        return torch.device("cpu")

    def seed(self, server_round: int, tag: str) -> int:
        """A seed fixed by (run seed, client, round, purpose): same numbers in any process."""
        text = f"{self.run.seed}/{self.cid}/{server_round}/{tag}"
        return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1

    def private_seed(self, server_round: int, tag: str) -> int:
        """A seed fixed by (the client's secret, round, purpose): nobody else can know it, and
        a round answered twice draws the same numbers (client.state.StateStore.secret)."""
        return private_seed(self.state.secret(), f"{self.cid}/{server_round}/{tag}")


def own_data(data_fn: DataFn, partition: int, partitions: int) -> ClientData:
    """The user's data of this client (pollen.flower), checked to be a ClientData."""
    from federated_data import ClientData  # lazy: heavy data code

    data = data_fn(partition, partitions)
    if not isinstance(data, ClientData):
        raise ClientConfigError(
            f"the data function returned {type(data).__name__}, not the client's splits "
            "(pollen.flower.client_data(train, test, num_classes=C) makes them from (x, y) arrays "
            "or DataLoaders)"
        )
    return replace(data, client_id=partition)


class ResidentData:
    """The partitions a process keeps in memory, newest last: a resident worker
    (client.worker) the newest few of its node's; a simulation worker, which serves many
    clients in turn, as many as fit in `most_bytes`. Their arrays are made read-only so that no
    handler can change what the next message reads."""

    def __init__(self, limit: int = 2, most_bytes: int | None = None) -> None:
        self.limit = limit
        self.most_bytes = most_bytes
        self.bytes = 0
        self._kept: dict[tuple[Hashable, int, str], ClientData] = {}

    def get(self, key: tuple[Hashable, int, str]) -> ClientData | None:
        data = self._kept.pop(key, None)
        if data is not None:
            self._kept[key] = data  # newest last
        return data

    def keep(self, key: tuple[Hashable, int, str], data: ClientData) -> None:
        """Keep `data` (a partition larger than `most_bytes` alone is not kept)."""
        if self.most_bytes is not None and _nbytes(data) > self.most_bytes:
            return
        for split in (data.train, data.val, data.test):
            split.x.setflags(write=False)
            split.y.setflags(write=False)
        old = self._kept.pop(key, None)
        if old is not None:
            self.bytes -= _nbytes(old)
        self._kept[key] = data
        self.bytes += _nbytes(data)
        while self._kept and (
            len(self._kept) > self.limit
            or (self.most_bytes is not None and self.bytes > self.most_bytes)
        ):
            self.bytes -= _nbytes(self._kept.pop(next(iter(self._kept))))


def _nbytes(data: ClientData) -> int:
    return sum(s.x.nbytes + s.y.nbytes for s in (data.train, data.val, data.test))


_resident: ResidentData | None = None

SIMULATION_DATA_BYTES = 256 * 2**20
"""The partitions a simulation worker keeps in memory across rounds (keep_simulated_data)."""


def keep_data_resident(limit: int = 2, most_bytes: int | None = None) -> None:
    """From now on this process keeps the partitions it loads: a resident worker serves one
    node, so one partition, for many messages (`limit` of them); ClientApp processes, which
    serve one message, do not."""
    global _resident
    _resident = ResidentData(limit, most_bytes)
    # kept partitions are read-only; handlers copy what they change, so torch's note that a
    # tensor shares a read-only array is noise here
    warnings.filterwarnings("ignore", message="The given NumPy array is not writable")


def keep_simulated_data() -> None:
    """A simulation worker (a packed node's ClientApp, setting simulation-nodes) keeps the
    partitions it reads, up to SIMULATION_DATA_BYTES, the newest first: its clients come back
    every round (client.dispatch.answer_node)."""
    if _resident is None:
        keep_data_resident(sys.maxsize, SIMULATION_DATA_BYTES)


_out_of_band = False


def pass_arrays_out_of_band() -> None:
    """In a Ray worker (simulation), from now on the Arrays of what this process returns travel
    beside Ray's pickle stream (pollen.core.protocol.array_fields): written once into Ray's
    object store instead of copied into the stream and then into the store. The receiving side
    rebuilds each Array owning its bytes (array_of_fields), so what the server reads is as
    before. Without Ray loaded in this process (deployment) nothing changes."""
    global _out_of_band
    if _out_of_band or "ray" not in sys.modules:
        return
    import ray  # lazy: loaded already by Ray's worker; never imported here otherwise

    if not ray.is_initialized():
        return
    ray.util.register_serializer(Array, serializer=array_fields, deserializer=array_of_fields)
    _out_of_band = True


def hosted_clients(node: Mapping[str, Any], run: RunSettings) -> list[int]:
    """The clients a node serves: the one its partition-id names, or on a simulated node
    hosting several (setting simulation-nodes K: Flower's partition-id k of num-partitions K)
    the k-th of K contiguous blocks of client ids, of sizes differing by one at most (blocks in
    node order are clients in id order: the server can fold replies in client order as nodes
    answer)."""
    if "partition-id" not in node:
        raise ClientConfigError("node config has no partition-id")
    part = int(node["partition-id"])
    num, nodes = run.num_clients, run.simulation_nodes
    if nodes > num:
        raise ClientConfigError(f"simulation-nodes={nodes} is more than num-clients={num}")
    parts = nodes or num
    if "num-partitions" in node and int(node["num-partitions"]) != parts:
        if nodes:
            raise ClientConfigError(
                f"node has num-partitions={node['num-partitions']} but the run packs its "
                f"clients onto simulation-nodes={nodes}"
            )
        raise ClientConfigError(
            f"node has num-partitions={node['num-partitions']} but the run has num-clients={num}"
        )
    if not 0 <= part < parts:
        raise ClientConfigError(f"partition-id {part} outside [0, {parts}) for this run")
    return list(range(part * num // nodes, (part + 1) * num // nodes)) if nodes else [part]


def _state_root(node: Mapping[str, Any], cfg: Mapping[str, Scalar], run: RunSettings) -> Path:
    if node.get("state-dir"):
        return Path(str(node["state-dir"]))
    if run.client_state_dir:
        return Path(run.client_state_dir)
    if run.out_dir:
        return Path(run.out_dir) / "client-state"
    return _cache_dir(node, cfg) / "client-state"


def _cache_dir(node: Mapping[str, Any], cfg: Mapping[str, Scalar]) -> Path:
    if node.get("cache-dir"):
        return Path(str(node["cache-dir"]))
    return cache_dir(cfg)


ClientHandler = Callable[[RecordDict, ClientEnv], RecordDict]


def client_handler(spec: AlgorithmSpec, message_type: str) -> ClientHandler:
    """The client half's handler for `message_type`, loaded by the name the registry gives
    (`spec.client`): the registry holds names, never the halves."""
    module, _, attr = spec.client.partition(":")
    handlers: dict[str, Any] = getattr(importlib.import_module(module), attr or "HANDLERS")
    if message_type not in handlers:
        raise KeyError(f"algorithm {spec.name!r} has no client handler for {message_type!r}")
    handler: ClientHandler = handlers[message_type]
    return handler
