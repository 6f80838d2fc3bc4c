"""What summary.json and the server log say of a run beyond its metrics: the robust rule and a
simulated attack (docs/robustness.md), secure aggregation (docs/security.md), the privacy
guarantees (docs/privacy.md), and a round's one-line brief."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from pollen.core.contracts import client_dp, dp_sgd
from pollen.core.protection import (
    AttackSettings,
    ClientDPSettings,
    DPSettings,
    RobustSettings,
    SecAggSettings,
)
from pollen.core.settings import Scalar


def threat_summary(settings: Mapping[str, Scalar]) -> dict[str, Any]:
    """What summary.json says of robustness: the robust rule when it is not the plain mean, and
    the simulated attack when one ran (docs/robustness.md)."""
    robust, attack = RobustSettings.of(settings), AttackSettings.of(settings)
    out: dict[str, Any] = {}
    if robust != RobustSettings():
        out["robust"] = {s.key: getattr(robust, f) for f, s in zip(
            (f.name for f in fields(RobustSettings)), RobustSettings.declarations(), strict=True
        )}  # fmt: skip
    if attack.active:
        out["attack"] = {"clients": list(attack.ids()), "kind": attack.kind,
                         "simulated": True}  # fmt: skip
    secagg = SecAggSettings.of(settings)
    if secagg.enabled:
        out["secure-aggregation"] = {
            "protocol": "SecAgg+",
            **{s.key: getattr(secagg, f) for f, s in zip(
                (f.name for f in fields(SecAggSettings)), SecAggSettings.declarations(), strict=True
            ) if s.key != "secagg.enabled"},
            "server-sees": "each point's sum over the clients, and every client's metrics",
        }  # fmt: skip
    return out


def privacy_summary(
    settings: Mapping[str, Scalar],
    train: Mapping[str, Any],
    own: Mapping[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """What summary.json says of differential privacy (docs/privacy.md): each guarantee the run
    gives, with the epsilon its last round reached (-1: none) and what it protects; `own`: the
    algorithm's own (Strategy.privacy_guarantees)."""
    out: dict[str, Any] = dict(own or {})
    mech = client_dp.mechanism(settings)
    if mech is not None:
        dp = ClientDPSettings.of(settings)
        out["client-level"] = {
            "epsilon": train.get(client_dp.EPSILON),
            "delta": dp.delta,
            "noise-multiplier": mech.noise_multiplier,
            "clip": dp.clip,
            "adaptive-clipping": dp.adaptive,
            "noise-at": "clients, in the secure sum" if mech.distributed else dp.noise_at,
            "sample-rate": mech.sample_rate,
            "accounted-rate": mech.accounted_rate,
            "sensitivity": f"{mech.sensitivity:g} x clip"
            + (" (over-selection: one client in, another out)" if mech.over_selection else "")
            + (" (FedBuff: one client's update replaced, in each version)" if mech.buffer else ""),
            "protects": "everything one client contributes over the run"
            + (", against the server too" if mech.at_client else ", against all but the server"),
        }
        if mech.distributed:
            out["client-level"]["mechanism"] = "distributed Skellam"
            out["client-level"]["epsilon-vs-server"] = train.get(client_dp.EPSILON_VS_SERVER)
    example = DPSettings.of(settings)
    if example.enabled:
        out["example-level"] = {
            "epsilon": train.get(dp_sgd.EPSILON),
            "delta": example.delta,
            "mechanism": "DP-SGD",
            "protects": "one training example of a client, in everything the client sends",
        }
    return {"privacy": out} if out else {}


def round_line(row: Mapping[str, Any]) -> str:
    """The round's line in the server log: its accuracies and losses, and its seconds."""
    parts = []
    for section in ("train", "server-eval"):
        for key, value in (row.get(section) or {}).items():
            if isinstance(value, float) and ("accuracy" in key or "loss" in key):
                parts.append(f"{section}/{key}={value:.4f}")
    return " ".join(parts) + f" ({row.get('seconds', 0):.1f} s)"
