"""How a round is paced (docs/pacing.md): deadline rounds with over-selection (`round.*`;
Bonawitz et al., "Towards Federated Learning at Scale: System Design", MLSys 2019: select about
130 % of the clients wanted, keep the first that report, close at a deadline), buffered
asynchronous aggregation (`async.*`, FedBuff) and the devices
the clients run on (`heterogeneity.*`): each client's compute speed, link bandwidth and
latency, from a built-in profile or a CSV file, on a virtual clock in simulation or as real
delays on the client side.

A device's time for one message is the time to receive the instruction, compute and send the
reply back:

    latency + bytes down / bandwidth + examples x seconds per example + bytes up / bandwidth
    + latency

as FedScale's simulator counts a client's round (Lai et al., ICML 2022: compute from the
device's per-example speed, communication from the bytes and its bandwidth); here the
latency is counted once each way.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from pollen.core.device_data import BANDWIDTH_MBPS, PHONE_CPU_SCORES
from pollen.core.settings import Scalar, SettingsError, SettingsGroup, setting

PROFILES = ("none", "tiers", "lognormal", "phones")
"""The built-in device profiles (`heterogeneity.profile`); any other value is a CSV file."""

CLOCKS = ("wall", "virtual")

CSV_COLUMNS = ("example-ms", "bandwidth-mbps", "latency-ms")
"""A device CSV's columns (a `client` column is optional: row i serves client i)."""


@dataclass(frozen=True)
class RoundSettings(SettingsGroup):
    """Deadline rounds with over-selection (docs/pacing.md#deadline-rounds)."""

    PREFIX: ClassVar[str] = "round"

    deadline: float = setting(
        0.0,
        "seconds each phase of a round waits before it closes with the valid replies it has "
        "(virtual seconds under heterogeneity.clock=virtual); later replies are left out and "
        "counted as late; 0: every phase waits for every client (up to phase-timeout)",
        minimum=0.0,
    )
    over_selection: float = setting(
        0.0,
        "extra share of clients sampled each round (0.3: 130 % of fraction-train's count); the "
        "round's first phase closes as soon as the count it wants sent valid replies, and the "
        "later phases go to those clients only; 0: sample the count wanted",
        minimum=0.0,
        maximum=10.0,
    )

    @property
    def enabled(self) -> bool:
        return self.deadline > 0 or self.over_selection > 0


@dataclass(frozen=True)
class AsyncSettings(SettingsGroup):
    """Buffered asynchronous aggregation (FedBuff: Nguyen et al., "Federated Learning with
    Buffered Asynchronous Aggregation", AISTATS 2022; docs/pacing.md#buffered-asynchronous-
    aggregation). A round is then one model version."""

    PREFIX: ClassVar[str] = "async"

    buffer: int = setting(
        0,
        "FedBuff: valid replies folded into each new model version (a round is then one "
        "version, num-rounds the versions made); 0: synchronous rounds",
        minimum=0,
    )
    concurrency: int = setting(
        0,
        "FedBuff: clients kept training at once, each handed the newest version when it is "
        "free; 0: fraction-train's count of clients (at most the training clients)",
        minimum=0,
    )
    max_staleness: int = setting(
        10,
        "FedBuff: a reply trained on a model more than this many versions older than the "
        "newest is dropped (counted as stale)",
        minimum=0,
    )
    staleness_exponent: float = setting(
        0.5,
        "FedBuff: a reply of staleness s weighs 1/(1+s)^exponent (the paper's 1/sqrt(1+s))",
        minimum=0.0,
    )
    server_lr: float = setting(
        1.0,
        "FedBuff: the server's step on the buffer's weighted mean update (eta_g)",
        minimum=1e-9,
    )

    @property
    def enabled(self) -> bool:
        return self.buffer > 0


@dataclass(frozen=True)
class HeterogeneitySettings(SettingsGroup):
    """The clients' devices (docs/pacing.md#devices)."""

    PREFIX: ClassVar[str] = "heterogeneity"

    profile: str = setting(
        "none",
        "the clients' devices: 'none' (every client as fast as its machine), 'tiers' "
        "(slow-fraction of the clients slowdown times slower in compute and link), "
        "'lognormal' (each client's compute example-ms times a log-normal factor, FedScale's "
        "model of device speeds; the link as 'tiers' fast one), 'phones' (each client's "
        "compute and link drawn from published measurements of Android phones: AI "
        "Benchmark's CPU scores and measured bandwidths on heterogeneity.network), or a CSV "
        "file with columns example-ms, bandwidth-mbps, latency-ms (row i: client i, rows "
        "repeated when fewer than the clients)",
    )
    network: str = setting(
        "wifi",
        "'phones': the measured links the clients' bandwidths are drawn from: 'wifi' (WiFi 4, "
        "5 and 6 pooled, where production federations train), '4g' or '5g'",
        choices=tuple(BANDWIDTH_MBPS),
    )
    clock: str = setting(
        "wall",
        "'virtual': each reply reports the time its device would take and the server paces "
        "rounds by it (simulation: a run ends the same on any machine); 'wall': a client waits "
        "out its device's extra time before it answers (deployment). pollen simulate uses "
        "'virtual' unless given",
        choices=CLOCKS,
    )
    slow_fraction: float = setting(
        0.2, "'tiers': share of the clients that are slow", minimum=0.0, maximum=1.0
    )
    slowdown: float = setting(
        10.0,
        "'tiers': how many times slower a slow client computes and moves bytes (its latency "
        "grows as much)",
        minimum=1.0,
    )
    example_ms: float = setting(
        5.0,
        "milliseconds a fast device ('tiers'; 'lognormal', 'phones': the median device) "
        "takes per training example on the virtual clock (FedScale's 5 ms); on the wall clock the "
        "fastest device of the profile is the machine itself",
        minimum=0.0,
    )
    bandwidth_mbps: float = setting(
        20.0, "a fast client's link ('tiers', 'lognormal'), in megabits per second", minimum=1e-3
    )
    latency_ms: float = setting(
        50.0,
        "a fast client's one-way latency ('tiers'; 'lognormal', 'phones': every client's), "
        "in ms",
        minimum=0.0,
    )

    @property
    def enabled(self) -> bool:
        return self.profile != "none"

    @property
    def virtual(self) -> bool:
        """Whether rounds are paced by the devices' virtual time."""
        return self.enabled and self.clock == "virtual"


@dataclass(frozen=True)
class Device:
    """One client's device."""

    example_ms: float
    """Milliseconds of compute per training example."""
    bandwidth_mbps: float
    """Link bandwidth, megabits per second, each way."""
    latency_ms: float
    """One-way latency, milliseconds."""

    def seconds(self, examples: int, bytes_down: int, bytes_up: int) -> float:
        """The device's time for one message (module docstring)."""
        link = (bytes_down + bytes_up) * 8 / (self.bandwidth_mbps * 1e6)
        return 2 * self.latency_ms / 1e3 + link + examples * self.example_ms / 1e3

    def extra_seconds(
        self, compute_seconds: float, reference: Device, bytes_down: int, bytes_up: int
    ) -> float:
        """On the wall clock: what a client waits before answering so that the message takes
        as long as on this device: its compute stretched by how much slower this device is
        than the profile's `reference` (never shortened), and its link and latency."""
        factor = self.example_ms / reference.example_ms if reference.example_ms > 0 else 1.0
        link = (bytes_down + bytes_up) * 8 / (self.bandwidth_mbps * 1e6)
        return max(0.0, factor - 1) * compute_seconds + link + 2 * self.latency_ms / 1e3

    def to_json(self) -> dict[str, float]:
        return {
            "example-ms": self.example_ms,
            "bandwidth-mbps": self.bandwidth_mbps,
            "latency-ms": self.latency_ms,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Scalar]) -> Device:
        return cls(
            float(obj["example-ms"]), float(obj["bandwidth-mbps"]), float(obj["latency-ms"])
        )


LOGNORMAL = (1.0, 0.6)
"""'lognormal': the mean and sigma of the normal whose exponential scales a client's compute:
FedScale's `ClientMetadata.get_completion_time_lognormal` (its defaults: 5 ms an example times
lognormal(1, 0.6), after Huba et al., PAPAYA, MLSys 2022), divided here by its median e so that
example-ms stays the median device's."""


def draw(percentiles: tuple[float, ...], rng: np.random.Generator, size: int) -> np.ndarray:
    """`size` values of the distribution whose percentiles 0, 1, ..., 100 are `percentiles`
    (pollen.core.device_data): its quantile function, linear in the logarithm between adjacent
    percentiles, at uniform draws."""
    at = rng.random(size) * (len(percentiles) - 1)
    return np.exp(np.interp(at, np.arange(len(percentiles)), np.log(percentiles)))


def devices(settings: Mapping[str, Scalar], num_clients: int, seed: int) -> list[Device]:
    """Every client's device, by client id, for the run's `heterogeneity.*` (empty when off):
    fixed by the settings and the seed, so the server and every rerun agree. SettingsError
    naming the problem when a CSV file cannot serve."""
    het = HeterogeneitySettings.of(settings)
    if not het.enabled:
        return []
    rng = np.random.default_rng([seed, 0x6E7])
    if het.profile == "tiers":
        fast = Device(het.example_ms, het.bandwidth_mbps, het.latency_ms)
        s = het.slowdown
        slow = Device(fast.example_ms * s, fast.bandwidth_mbps / s, fast.latency_ms * s)
        count = round(het.slow_fraction * num_clients)
        slow_ids = set(rng.permutation(num_clients)[:count].tolist())
        return [slow if c in slow_ids else fast for c in range(num_clients)]
    if het.profile == "lognormal":
        mean, sigma = LOGNORMAL
        factors = np.exp(rng.normal(mean, sigma, size=num_clients) - mean)
        return [
            Device(het.example_ms * float(f), het.bandwidth_mbps, het.latency_ms)
            for f in factors
        ]
    if het.profile == "phones":
        # a phone's time per example is inversely proportional to its score; compute first,
        # so that the network chosen leaves each client's compute as it is
        factor = PHONE_CPU_SCORES[50] / draw(PHONE_CPU_SCORES, rng, num_clients)
        mbps = draw(BANDWIDTH_MBPS[het.network], rng, num_clients)
        return [
            Device(het.example_ms * float(f), float(b), het.latency_ms)
            for f, b in zip(factor, mbps, strict=True)
        ]
    table = read_csv(Path(het.profile))
    return [table[c % len(table)] for c in range(num_clients)]


def slowness(devices_: list[Device]) -> list[float]:
    """How many times longer each device may take for a message than the profile's typical
    device (each resource's median over the clients: compute, link and latency): its largest
    ratio to those medians, at least 1, so that its time for any message is at most that times
    the typical device's. A phase's resend wait is a multiple of its typical reply time (the
    time by which half of its messages were answered: server.resend), so the server lets a
    slow device's instruction wait as much longer before it sends it again."""
    if not devices_:
        return []
    ms = float(np.median([d.example_ms for d in devices_]))
    mbps = float(np.median([d.bandwidth_mbps for d in devices_]))
    latency = float(np.median([d.latency_ms for d in devices_]))
    return [
        max(
            d.example_ms / ms if ms > 0 else 1.0,
            mbps / d.bandwidth_mbps,
            d.latency_ms / latency if latency > 0 else 1.0,
            1.0,
        )
        for d in devices_
    ]


def reference(devices_: list[Device]) -> Device:
    """The device the wall clock takes the machine for: the fastest compute of the profile."""
    return min(devices_, key=lambda d: d.example_ms)


def read_csv(path: Path) -> list[Device]:
    """A device CSV's rows (columns CSV_COLUMNS, optionally `client`); SettingsError in one
    line naming the file and the problem."""
    where = f"heterogeneity.profile={path}"
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingsError(
            f"{where}: cannot read it ({exc.__class__.__name__}: {exc}); give 'none', "
            f"{', '.join(repr(p) for p in PROFILES[1:])} or a CSV file with columns "
            f"{', '.join(CSV_COLUMNS)}"
        ) from None
    reader = csv.DictReader(text.splitlines())
    missing = [c for c in CSV_COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise SettingsError(f"{where}: no column {', '.join(missing)} in its header line")
    rows: list[tuple[int, Device]] = []
    for line, row in enumerate(reader, start=2):
        try:
            values = [float(row[c]) for c in CSV_COLUMNS]
            client = int(row["client"]) if row.get("client") not in (None, "") else len(rows)
        except (TypeError, ValueError):
            raise SettingsError(f"{where}: line {line} is not numbers: {row}") from None
        ms, mbps, latency = values
        if not all(math.isfinite(v) for v in values) or ms < 0 or mbps <= 0 or latency < 0:
            raise SettingsError(
                f"{where}: line {line}: example-ms and latency-ms must be >= 0 and "
                "bandwidth-mbps > 0"
            )
        rows.append((client, Device(ms, mbps, latency)))
    if not rows:
        raise SettingsError(f"{where}: no devices in it")
    clients = sorted(c for c, _ in rows)
    if clients != list(range(len(rows))):
        raise SettingsError(
            f"{where}: its client column must number the rows 0, 1, ..., {len(rows) - 1}"
        )
    return [d for _, d in sorted(rows, key=lambda r: r[0])]
