"""Secure aggregation's contract between the server's side of the protocol (server.secagg) and
the clients' (client.secagg): the stages of a secure sum, the records its messages carry, and
what a client sums (docs/security.md#secure-aggregation).

A secure sum is four exchanges (five with the consistency round), one SecAgg+ stage each (Bell
et al., CCS 2020, Fig. 1; the stages of Bonawitz et al., CCS 2017, Sec. 4 over a sparse graph):

  KEYS      advertise keys: each client draws two key pairs and a self-mask seed for the
            session and answers its public keys and a hash of the seed.
  SHARES    share keys: each client gets the list of the clients that advertised keys with the
            digest of each one's keys, from which it draws the graph (secagg.graph.seed_of)
            and its neighbourhood, and its neighbours' public keys, which it checks against
            their digests; it splits its seed and its masking key into Shamir shares (t of
            k + 1) and answers one sealed for each neighbour.
  masked    the algorithm's own phase (train, a gradient, a correlation matrix...) with the
            sealed shares addressed to the client and a `secagg-config` record that says what
            it sums: the client runs the phase, then answers, in place of the summed records,
            their encoding plus its self mask and its pairwise masks (`secagg-masked`).
  CONSISTENCY  (`secagg.consistency`) the clients in the sum get its list and answer their
            signature on it and on the graph's seed (each advertised a signing key with its
            keys, Bonawitz et al., CCS 2017, Sec. 4: ConsistencyCheck).
  UNMASK    the clients in the sum get the lists of their neighbours who are in it and who
            dropped out (and their neighbours' signatures on the sum's list), and answer the
            shares of the first's seeds and of the second's masking keys, never both for one
            neighbour (and only after t signatures from their neighbourhood on the same list).

Every stage's records are array bundles (pollen.core.protocol), byte strings as uint8 arrays,
and a ConfigRecord `secagg-config`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from flwr.app import ConfigRecord, RecordDict

from pollen.core.protection import SecAggSettings
from pollen.core.settings import RunSettings, Scalar, SettingsError
from secagg.encoding import MAX_MODULUS_BITS, modulus_bits_for
from secagg.noise import tail

KEYS = "query.secagg_keys"
SHARES = "query.secagg_shares"
CONSISTENCY = "query.secagg_consistency"
UNMASK = "query.secagg_unmask"
STAGES = (KEYS, SHARES, CONSISTENCY, UNMASK)
"""The message types of the protocol's own stages (the masked stage is the algorithm's)."""

BYTES = "secagg"
"""Array bundle of a stage's byte strings (keys, sealed shares, shares), as uint8 arrays."""
CONFIG = "secagg-config"
"""ConfigRecord of a stage's instruction."""
MASKED = "secagg-masked"
"""Array bundle of a masked reply: its one array `y`."""
Y = "y"

SESSION = "session"
COHORT = "cohort"
"""Keys stage: every client asked for the sum."""
MEMBERS = "members"
"""Shares stage: every client whose keys were taken (the graph's nodes, among which the noise
is shared out)."""
DIGESTS = "digests"
"""Shares stage: the byte string of each member's keys digest (secagg.keys.bundle_digest),
32 bytes each, in the order of `members`."""
SURVIVORS = "survivors"
DROPPED = "dropped"
SUM = "sum"
"""Unmask stage: every client whose masked input is in the sum."""

PROTECTED_METRICS = ("control-norm", "pi-entropy")
"""Reply metrics that are functions of what a client keeps hidden (SCAFFOLD's control variate,
FedEM's mixture weights): a masked reply leaves them out."""


def to_bytes_record(items: Mapping[str, bytes]) -> dict[str, np.ndarray]:
    """Byte strings as the uint8 arrays of an array bundle."""
    return {name: np.frombuffer(bytes(data), dtype=np.uint8) for name, data in items.items()}


def byte_strings(arrays: Mapping[str, np.ndarray]) -> dict[str, bytes]:
    """The byte strings of a `secagg` bundle's arrays; ValueError for an array that is not
    one."""
    out: dict[str, bytes] = {}
    for name, arr in arrays.items():
        if arr.dtype != np.uint8 or arr.ndim != 1:
            raise ValueError(f"secagg record {name!r} is not a byte string")
        out[name] = arr.tobytes()
    return out


def digests_of(members: Sequence[int], blob: bytes) -> dict[int, bytes]:
    """Each member's keys digest from the shares stage's `digests` byte string; ValueError when
    it is not 32 bytes a member."""
    if len(blob) != 32 * len(members):
        raise ValueError(
            f"secagg digests: {len(blob)} bytes for {len(members)} clients, 32 each expected"
        )
    return {c: bytes(blob[32 * i : 32 * (i + 1)]) for i, c in enumerate(members)}


def config_of(content: RecordDict) -> ConfigRecord:
    record = content.get(CONFIG)
    if not isinstance(record, ConfigRecord):
        raise ValueError("no secagg-config record")
    return record


def ids(value: object, what: str) -> list[int]:
    """A list of client ids in a config record; ValueError naming `what` otherwise."""
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
    ):
        raise ValueError(f"secagg {what}: not a list of client ids")
    return [int(v) for v in value]


Layout = tuple[tuple[str, str, tuple[int, ...]], ...]
"""(record, array name, shape) of every array a client sums, in the order of its vector."""


def summed_array(value: np.ndarray) -> bool:
    """Whether an array is summed: floating-point ones. Integer arrays (BatchNorm's batch
    counters) are bookkeeping, not learned, and their increments (batches a round) would fall
    outside any range fitted to updates: they are left out, and the server keeps the value it
    sent."""
    return np.asarray(value).dtype.kind == "f"


def layout_of(records: Mapping[str, Mapping[str, np.ndarray]]) -> Layout:
    """The vector layout of the summed records: records in the order given, each record's
    floating-point arrays by name (`summed_array`)."""
    return tuple(
        (record, name, tuple(int(d) for d in np.shape(arrays[name])))
        for record, arrays in records.items()
        for name in sorted(arrays)
        if summed_array(arrays[name])
    )


def size_of(layout: Layout) -> int:
    return sum(int(np.prod(shape)) for _, _, shape in layout)


def flatten(parts: Mapping[str, Mapping[str, np.ndarray]], layout: Layout) -> np.ndarray:
    """The arrays of `parts` (record -> arrays) as one float64 vector in `layout`'s order;
    ValueError when one is missing, has another shape, or is not named by the layout."""
    given = {(r, n) for r, arrays in parts.items() for n in arrays}
    wanted = {(r, n) for r, n, _ in layout}
    if given != wanted:
        extra, missing = sorted(given - wanted), sorted(wanted - given)
        raise ValueError(f"summed arrays differ from the layout (extra {extra}, missing {missing})")
    out = []
    for record, name, shape in layout:
        value = np.asarray(parts[record][name])
        if value.shape != shape:
            raise ValueError(f"{record}.{name} has shape {value.shape}, the layout {shape}")
        out.append(value.astype(np.float64, copy=False).ravel())
    return np.concatenate(out) if out else np.zeros(0)


def unflatten(vector: np.ndarray, layout: Layout) -> dict[str, dict[str, np.ndarray]]:
    """A vector in `layout`'s order as record -> arrays (float64, views of the vector)."""
    out: dict[str, dict[str, np.ndarray]] = {}
    start = 0
    for record, name, shape in layout:
        size = int(np.prod(shape))
        out.setdefault(record, {})[name] = vector[start : start + size].reshape(shape)
        start += size
    if start != vector.size:
        raise ValueError(f"a vector of {vector.size} values does not fit a layout of {start}")
    return out


@dataclass(frozen=True)
class Summing:
    """What a client of a secure sum contributes: in the masked stage's `secagg-config`.

    Its vector is, for each summed record of its reply in `layout` order, the reply's arrays
    minus the instruction's record named by `around` (when there is one: the update around what
    it was sent), clipped to l2 norm `l2_clip` as a whole (0: not), multiplied by its weight
    (`weighted`: its num-examples / `weight_scale`, at most 1; else 1) and encoded with
    `clip`, `bits` and `modulus_bits` (secagg.encoding); integer noise of variance
    `noise_variance` (distributed DP, in encoded units) is added to every value."""

    session: str
    layout: Layout
    around: Mapping[str, str] = field(default_factory=dict)
    weighted: bool = False
    weight_scale: float = 1.0
    clip: float = 8.0
    bits: int = 22
    modulus_bits: int = 32
    l2_clip: float = 0.0
    noise_variance: float = 0.0

    def to_config(self) -> ConfigRecord:
        return ConfigRecord(
            {
                SESSION: self.session,
                "layout": json.dumps([[r, n, list(s)] for r, n, s in self.layout]),
                "around": json.dumps(dict(self.around)),
                "weighted": self.weighted,
                "weight-scale": float(self.weight_scale),
                "clip": float(self.clip),
                "bits": int(self.bits),
                "modulus-bits": int(self.modulus_bits),
                "l2-clip": float(self.l2_clip),
                "noise-variance": float(self.noise_variance),
            }
        )

    @classmethod
    def of(cls, record: ConfigRecord) -> Summing:
        """The summing a config record describes; ValueError naming what is malformed."""
        try:
            entries = json.loads(str(record["layout"]))
            layout = tuple((str(r), str(n), tuple(int(d) for d in s)) for r, n, s in entries)
            around = {str(k): str(v) for k, v in json.loads(str(record["around"])).items()}
            return cls(
                session=str(record[SESSION]),
                layout=layout,
                around=around,
                weighted=bool(record["weighted"]),
                weight_scale=_number(record, "weight-scale"),
                clip=_number(record, "clip"),
                bits=int(_number(record, "bits")),
                modulus_bits=int(_number(record, "modulus-bits")),
                l2_clip=_number(record, "l2-clip"),
                noise_variance=_number(record, "noise-variance"),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"malformed secagg-config ({type(exc).__name__}: {exc})") from None

    def records(self) -> Sequence[str]:
        """The summed records, in the vector's order."""
        return list(dict.fromkeys(r for r, _, _ in self.layout))


def noise_tail(settings: Mapping[str, Scalar]) -> float:
    """The range, in encoded units, that distributed DP's noise on a sum stays within but with
    probability below secagg.noise.TAIL_PROBABILITY a value (0 without it)."""
    from pollen.core.contracts import client_dp  # lazy: opacus for a target epsilon

    mech = client_dp.mechanism(settings)
    if mech is None or not mech.distributed:
        return 0.0
    return tail((mech.noise_multiplier * mech.unit) ** 2)


def _number(record: ConfigRecord, key: str) -> float:
    value = record[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{key} is not a number: {value!r}")
    return float(value)


def modulus_bits(settings: Mapping[str, Scalar]) -> int:
    """The bits of the run's modulus: `secagg.modulus-bits`, or (0) the fewest with which the
    sum of every training client, with distributed DP's noise (`noise_tail`), never wraps.
    SettingsError when the setting is smaller than that, or no modulus of 64 bits holds it."""
    s, run = SecAggSettings.of(settings), RunSettings.of(settings)
    extra = noise_tail(settings)
    clients = max(run.training_clients, 2)
    needed = modulus_bits_for(s.bits, clients, extra)
    if needed > MAX_MODULUS_BITS:
        raise SettingsError(
            f"secagg: a sum of {clients} clients of {s.bits}-bit values"
            + (" and their noise" if extra else "")
            + f" needs a modulus of {needed} bits, above {MAX_MODULUS_BITS}; lower secagg.bits"
        )
    if s.modulus_bits == 0:
        return needed
    if s.modulus_bits < needed:
        raise SettingsError(
            f"secagg.modulus-bits={s.modulus_bits}: the sum of {clients} clients of "
            f"{s.bits}-bit values"
            + (" and their noise" if extra else "")
            + f" could wrap modulo 2^{s.modulus_bits}; give at least {needed} (or 0: the "
            "fewest that hold it)"
        )
    return s.modulus_bits
