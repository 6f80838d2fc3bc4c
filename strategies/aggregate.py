"""Aggregation and reply-checking helpers shared by strategies (vectorized NumPy)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np
from flwr.app import ArrayRecord, MetricRecord, RecordDict

from pollen.core import protocol
from pollen.core.protection import AttackSettings
from strategies.base import ClientInfo, Federation, InvalidReply


class RunningMean:
    """A weighted mean of models added one at a time: sum of weight x model in float64 (in
    place, memory of one model), divided by the sum of the weights at the end; each tensor comes
    back in its own dtype (integers rounded). Adding in the same order gives the same bits."""

    def __init__(self) -> None:
        self._sums: dict[str, np.ndarray] = {}
        self._terms: dict[str, np.ndarray] = {}
        self._dtypes: dict[str, np.dtype] = {}
        self._weights: list[float] = []

    def add(self, model: Mapping[str, np.ndarray], weight: float) -> None:
        w = float(weight)
        if not math.isfinite(w) or w < 0:
            raise ValueError(f"invalid aggregation weights: {weight!r} is not finite and >= 0")
        if not self._weights:
            for key, first in model.items():
                self._sums[key] = np.zeros(np.shape(first), dtype=np.float64)
                self._terms[key] = np.empty_like(self._sums[key])
                self._dtypes[key] = np.asarray(first).dtype
        for key, total in self._sums.items():
            np.multiply(model[key], w, out=self._terms[key], dtype=np.float64)
            total += self._terms[key]
        self._weights.append(w)

    def __len__(self) -> int:
        return len(self._weights)

    def result(self) -> dict[str, np.ndarray]:
        total = math.fsum(self._weights)
        if not self._weights:
            raise ValueError("nothing to average")
        if total <= 0:
            raise ValueError(f"invalid aggregation weights {self._weights!r}")
        out: dict[str, np.ndarray] = {}
        for key, value in self._sums.items():
            mean = value / total
            dtype = self._dtypes[key]
            out[key] = (mean if dtype.kind == "f" else np.rint(mean)).astype(dtype)
        return out


def weighted_average(
    models: Iterable[Mapping[str, np.ndarray]], weights: Sequence[float]
) -> dict[str, np.ndarray]:
    """Per-tensor weighted mean (RunningMean). `models` is consumed one at a time, so a
    generator that decodes each reply when its turn comes keeps one client's model in memory,
    not all of them."""
    w = list(weights)
    mean = RunningMean()
    for i, model in enumerate(models):
        if i >= len(w):
            raise ValueError(f"invalid aggregation weights {weights!r}: more models than weights")
        mean.add(model, w[i])
    if len(mean) != len(w):
        raise ValueError(f"invalid aggregation weights {weights!r}: {len(mean)} models")
    return mean.result()


def expect_arrays(
    content: RecordDict, name: str, reference: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """The reply's record `name`, checked to have exactly the reference's keys, shapes, dtypes
    (read-only views of the reply's bytes)."""
    record = content.get(name)
    if not isinstance(record, ArrayRecord):
        raise InvalidReply(f"missing array record '{name}'")
    try:
        arrays = protocol.from_record(record, copy=False)
    except protocol.BundleError as exc:
        raise InvalidReply(f"record '{name}': {exc}") from None
    keys = set(arrays)
    if keys != set(reference):
        missing, extra = sorted(set(reference) - keys), sorted(keys - set(reference))
        raise InvalidReply(f"record '{name}' keys differ (missing {missing}, extra {extra})")
    out: dict[str, np.ndarray] = {}
    for key, ref in reference.items():
        arr = arrays[key]
        if arr.shape != ref.shape:
            raise InvalidReply(f"{name}.{key} has shape {arr.shape}, expected {ref.shape}")
        if arr.dtype != ref.dtype:
            raise InvalidReply(f"{name}.{key} has dtype {arr.dtype}, expected {ref.dtype}")
        out[key] = arr
    return out


def train_from(
    fed: Federation,
    starts: Mapping[int, Mapping[str, np.ndarray]],
    config: Mapping[str, int | float | str | bool],
) -> dict[int, RecordDict]:
    """One "train" exchange in which each client starts from its own arrays; a reply must
    carry arrays with the keys, shapes and dtypes of what that client was sent."""
    payloads = {
        cid: protocol.instruction(fed.server_round, "train", config, arrays=start)
        for cid, start in starts.items()
    }

    def validate(cid: int, content: RecordDict) -> None:
        expect_arrays(content, protocol.ARRAYS, starts[cid])

    return fed.exchange("train", payloads, validate)


def staleness_weight(staleness: int, exponent: float) -> float:
    """FedBuff's weight of a reply trained on a model `staleness` versions old: 1/(1+s)^a
    (Nguyen et al., AISTATS 2022, with a = 1/2)."""
    return float((1.0 + staleness) ** -exponent)


def num_examples(content: RecordDict) -> int:
    return protocol.as_int(protocol.metrics_of(content)[protocol.NUM_EXAMPLES])


def honest(fed: Federation, replies: Mapping[int, RecordDict]) -> dict[int, RecordDict]:
    """The replies of the clients that are not simulated attackers (`attack.clients`): what a
    robustness evaluation reports (an attacker's personal model is its own business)."""
    attackers = set(AttackSettings.of(fed.settings).ids())
    return {c: r for c, r in replies.items() if c not in attackers}


def final_evaluation(
    fed: Federation, instruction: Callable[[ClientInfo, bool], RecordDict]
) -> dict[str, float]:
    """One evaluation exchange with every connected client; unseen clients (`unseen=True`
    in `instruction`) are reported apart, as `unseen-<metric>`, and simulated attackers not
    at all (`honest`)."""
    seen, unseen = fed.available(), fed.unseen()
    payloads = {c.cid: instruction(c, False) for c in seen}
    payloads.update({c.cid: instruction(c, True) for c in unseen})
    replies = honest(fed, fed.exchange("evaluate", payloads))
    held_out = {c.cid for c in unseen}
    out = aggregate_metrics({c: r for c, r in replies.items() if c not in held_out})
    new = {c: r for c, r in replies.items() if c in held_out}
    if new:
        out.update({f"unseen-{k}": v for k, v in aggregate_metrics(new).items()})
    return out


def _weight(metrics: MetricRecord, key: str) -> object:
    """The count a metric is averaged with: `<prefix>-examples` for the longest prefix of the
    metric's name that has one (global-test-accuracy -> global-test-examples, test-examples),
    else num-examples."""
    parts = key.split("-")
    for i in range(len(parts) - 1, 0, -1):
        count = metrics.get("-".join(parts[:i]) + "-examples")
        if count is not None:
            return count
    return metrics.get(protocol.NUM_EXAMPLES, 1)


def aggregate_metrics(replies: Mapping[int, RecordDict]) -> dict[str, float]:
    """Client metrics combined: each metric weighted by its split's example count (see
    `_weight`); accuracies (and reconstruction energies) also get the unweighted 10th
    percentile and min over clients, the figures personalised FL reports, and errors the
    worst client's (max)."""
    per_key: dict[str, list[tuple[float, float]]] = {}
    for content in replies.values():
        metrics = content[protocol.METRICS]
        assert isinstance(metrics, MetricRecord)
        for key, value in metrics.items():
            if not isinstance(value, int | float) or key.endswith("examples"):
                continue
            weight = _weight(metrics, key)
            per_key.setdefault(key, []).append((float(value), float(weight)))  # type: ignore[arg-type]
    out: dict[str, float] = {}
    for key, pairs in sorted(per_key.items()):
        values = np.array([v for v, _ in pairs])
        weights = np.array([w for _, w in pairs])
        out[key] = (
            float(np.average(values, weights=weights))
            if weights.sum() > 0
            else float(values.mean())
        )
        if key.endswith(("accuracy", "energy")):
            out[f"{key}-p10"] = float(np.percentile(values, 10))
            out[f"{key}-min"] = float(values.min())
        elif key.endswith(("error", "error-ratio")):  # lower is better: the worst is the max
            out[f"{key}-max"] = float(values.max())
    out["clients"] = float(len(replies))
    return out


class Traffic:
    """Bytes of array data per client, measured from the messages of each phase."""

    def __init__(self) -> None:
        self.down: dict[str, int] = {}
        self.up: dict[str, int] = {}

    def add(
        self, phase: str, sent: Mapping[int, RecordDict], replies: Mapping[int, RecordDict]
    ) -> None:
        self.down[phase] = sum(protocol.payload_bytes(m) for m in sent.values()) // max(
            len(sent), 1
        )
        self.up[phase] = sum(protocol.payload_bytes(m) for m in replies.values()) // max(
            len(replies), 1
        )

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for phase in self.down:
            out[f"bytes-down-{phase}"] = float(self.down[phase])
            out[f"bytes-up-{phase}"] = float(self.up[phase])
        out["bytes-per-client"] = float(sum(self.down.values()) + sum(self.up.values()))
        return out
