"""Secure aggregation's settings (pollen.core.runconfig, pollen.core.contracts.secagg): what is
refused before anything starts, each in one line, and the modulus a run gets; what the summary
and the report say of it."""

from __future__ import annotations

from typing import Any

import pytest

from pollen.core.contracts import client_dp
from pollen.core.contracts import secagg as contract
from pollen.core.protection import SecAggSettings
from pollen.core.registry import ALGORITHMS
from pollen.core.runconfig import resolve
from pollen.core.settings import SettingsError
from server.summary import privacy_summary, threat_summary

ON = {"secagg.enabled": True, "num-clients": 10}


def test_each_algorithm_takes_secure_aggregation_or_says_why_not() -> None:
    for name, spec in ALGORITHMS.items():
        if spec.secagg:
            resolve({**ON, "algorithm": name})
        else:
            assert spec.secagg_note, name
            with pytest.raises(SettingsError, match=f"{name} refuses secure aggregation") as e:
                resolve({**ON, "algorithm": name})
            assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"robust.rule": "median", "robust.f": 1}, "robust.rule=median with secagg"),
        ({"robust.rule": "krum", "robust.f": 1}, "robust.clip is then done by each client"),
        ({"robust.clip-quantile": 0.5}, "clip-quantile / robust.nnm / robust.bucket"),
        ({"robust.nnm": True, "robust.f": 1}, "read or mix the clients' updates"),
        ({"robust.bucket": 2}, "read or mix"),
        ({"attack.clients": "1", "attack.kind": "sign-flip"}, "replace their updates at"),
        (
            {
                "num-clients": 100,
                "client-dp.noise-multiplier": 1.0,
                "client-dp.target-quantile": 0.5,
            },
            "adaptive clipping reads whether",
        ),
        ({"algorithm": "fedlrt", "fedlrt.warm-start": 5}, "warm start trains on one client"),
        ({"algorithm": "fedlin", "fedlrt.warm-start": 5}, "warm start"),
        ({"num-clients": 1}, "sums two clients at least"),
        ({"fraction-train": 0.1}, "with 1 clients a round"),
        (
            {
                "client-dp.noise-multiplier": 1.0,
                "client-dp.noise-at": "client",
                "fraction-train": 0.1,
            },
            "with 1 clients a round",
        ),
        ({"num-clients": 3, "secagg.collusion": 2}, "each client sums with 4 at least"),
        ({"num-clients": 20, "secagg.degree": 4, "secagg.collusion": 5},
         "collusion=5: .* neighbourhood of 5 needs a threshold of 6 shares"),
        ({"secagg.dropout": 0.05}, "^secagg.dropout=0.05: no degree, the complete graph "
         "included, keeps t shareholders in every neighbourhood of a sum of 10 clients"),
        ({"num-clients": 1000, "secagg.degree": 8, "secagg.dropout": 0.1},
         r"^secagg.degree=8, secagg.dropout=0.1: a degree of 8 \(secagg.degree=8\) leaves"),
        ({"num-clients": 1000, "secagg.collusion": 1, "secagg.dropout": 0.2, "secagg.degree": 80},
         "^secagg.degree=80, secagg.collusion=1, secagg.dropout=0.2: a degree of 80"),
        ({"num-clients": 1000, "secagg.modulus-bits": 30}, "could wrap modulo 2\\^30; give at"),
        ({"num-clients": 100000, "secagg.bits": 48}, "above 64; lower secagg.bits"),
        ({"algorithm": "fedsc", "fedsc.noise-at": "sum", "fedsc.noise-std": 0.1,
          "secagg.enabled": False}, "give secagg.enabled=true"),
        ({"algorithm": "fedsc", "fedsc.noise-at": "sum"}, "fedsc.noise-std, which is 0"),
    ],
)
def test_what_secure_aggregation_cannot_honour_is_refused_in_one_line(
    settings: dict[str, Any], message: str
) -> None:
    with pytest.raises(SettingsError, match=message) as info:
        resolve({**ON, **settings})
    assert "\n" not in str(info.value)


def test_a_simulated_run_s_dropout_target_is_refused_before_it_starts() -> None:
    """`pollen simulate --clients 10 --set secagg.enabled=true --set secagg.dropout=0.05`: no
    graph of 10 clients keeps t = 6 shareholders in every neighbourhood but with 2^-20; at 100
    clients k and t grow from 14, 8 to 22, 12."""
    cfg = {"dataset": "digits", "num-clients": 10, "num-rounds": 1, "secagg.enabled": True,
           "secagg.dropout": 0.05}  # fmt: skip
    with pytest.raises(SettingsError, match=r"lower secagg\.dropout or sum more clients") as info:
        resolve(cfg)
    assert "\n" not in str(info.value)
    ok = resolve({**cfg, "num-clients": 100})
    assert SecAggSettings.of(ok).graph_for(100) == (22, 12)
    assert SecAggSettings.of(resolve({**cfg, "num-clients": 100, "secagg.dropout": 0.0})
                             ).graph_for(100) == (14, 8)  # fmt: skip


def test_what_it_can_honour_starts() -> None:
    resolve({**ON, "robust.clip": 0.5})  # done by each client
    resolve({**ON, "attack.clients": "1", "attack.kind": "label-flip"})
    resolve({**ON, "client-dp.noise-multiplier": 1.0})  # the noise on the server, clients clip
    resolve({**ON, "client-dp.noise-multiplier": 1.0, "client-dp.noise-at": "client"})
    resolve({**ON, "dp.noise-multiplier": 1.0})  # DP-SGD is the clients' own
    resolve({**ON, "num-clients": 1000, "secagg.modulus-bits": 32})
    resolve({**ON, "num-clients": 20, "secagg.collusion": 3})  # t = 13 of 21 (k = 20)
    resolve({**ON, "algorithm": "fedsc", "fedsc.noise-at": "sum", "fedsc.noise-std": 0.1})


def test_the_modulus_holds_every_client_and_distributed_noise() -> None:
    # R / 2 > n 2^(bits - 1): bits + the bits of n (10: 4 bits; 1000: 10, a 32-bit wire)
    assert contract.modulus_bits(resolve(ON)) == 22 + 4
    assert contract.modulus_bits(resolve({**ON, "num-clients": 1000})) == 32
    distributed = resolve({**ON, "client-dp.noise-multiplier": 1.0, "client-dp.noise-at": "client"})
    mech = client_dp.mechanism(distributed)
    assert mech is not None and mech.distributed and not mech.local
    assert mech.sample_rate == 1.0 and mech.unit == 2**21
    assert contract.modulus_bits(distributed) > contract.modulus_bits(resolve(ON))
    assert client_dp.poisson_sampling(distributed)
    # the noise on the clients without secure aggregation stays local
    local = client_dp.mechanism(resolve({"num-clients": 10, "client-dp.noise-multiplier": 1.0,
                                         "client-dp.noise-at": "client"}))  # fmt: skip
    assert local is not None and local.local and not local.distributed


def test_a_target_epsilon_calibrates_the_distributed_noise_for_its_accounting() -> None:
    cfg = resolve({**ON, "num-rounds": 20, "fraction-train": 0.5, "client-dp.noise-at": "client",
                   "client-dp.target-epsilon": 6.0})  # fmt: skip
    mech = client_dp.mechanism(cfg)
    assert mech is not None and mech.distributed
    assert 5.99 <= client_dp.planned_epsilon(mech, 20) <= 6.0
    central = client_dp.mechanism(resolve({**cfg, "secagg.enabled": False,
                                           "client-dp.noise-at": "server"}))  # fmt: skip
    assert central is not None
    # the Skellam accounting of a Poisson sample (a general bound) asks for more noise
    assert mech.noise_multiplier > central.noise_multiplier


def test_the_summary_states_secure_aggregation_and_the_distributed_guarantee() -> None:
    cfg = resolve({**ON, "client-dp.noise-multiplier": 1.0, "client-dp.noise-at": "client"})
    threats = threat_summary(cfg)
    secure = threats["secure-aggregation"]
    assert secure["protocol"] == "SecAgg+" and secure["secagg.bits"] == 22
    assert "sum" in secure["server-sees"]
    level = privacy_summary(cfg, {"client-epsilon": 3.0, "client-epsilon-vs-server": 5.0})
    entry = level["privacy"]["client-level"]
    assert entry["mechanism"] == "distributed Skellam" and entry["epsilon-vs-server"] == 5.0
    assert "against the server too" in entry["protects"]
    assert "secure-aggregation" not in threat_summary(resolve({"num-clients": 10}))
