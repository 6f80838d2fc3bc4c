"""Client-level DP on the server's side (strategies.robust's noisy mean, strategies.privacy's
account, the engine's Poisson sampling): epsilon against Flower's RdpAccountant and the exact
Gaussian mechanism, one client's bounded influence through the strategies that take it
(FedAvg, FedEM, SCAFFOLD), adaptive clipping, the refusals before start-up, and learning
through the real ServerApp and ClientApp."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np
import pytest
from flwr.app import RecordDict
from flwr.supercore.privacy_accounting import (
    GaussianPrivacyEvent,
    NeighboringRelation,
    PrivacyConfig,
    SamplingMethod,
)
from flwr.supercore.privacy_accounting.rdp_accountant import RdpAccountant

from models.privacy import epsilon
from pollen.core import protocol
from pollen.core.contracts import client_dp
from pollen.core.contracts.scaffold import CONTROL, CONTROL_DELTA
from pollen.core.registry import ALGORITHMS
from pollen.core.runconfig import foreign_settings, resolve
from pollen.core.settings import SettingsError
from strategies.base import ClientInfo
from strategies.fedavg import FedAvg
from strategies.fedem import FedEM
from strategies.privacy import PrivacyLedger
from strategies.robust import Combiner
from strategies.scaffold import Scaffold
from tests.fakes import ScriptedFederation, run_in_process, settings_of

N = 10
CLIENTS = [ClientInfo(c, 100 + c, 50, 0, 10) for c in range(N)]
DP = {"client-dp.noise-multiplier": 1.0, "client-dp.clip": 0.5, "client-dp.reproducible": True}


def _flat(arrays: dict[str, np.ndarray]) -> np.ndarray:
    return np.concatenate([np.asarray(arrays[k], np.float64).ravel() for k in sorted(arrays)])


# ---- accounting ------------------------------------------------------------------------------


@pytest.mark.parametrize(("q", "z", "rounds"), [(1.0, 1.0, 20), (0.5, 1.0, 20), (0.1, 0.8, 50),
                                                (0.3, 2.0, 100)])  # fmt: skip
def test_server_noise_epsilon_is_flowers_rdp_accountant(q: float, z: float, rounds: int) -> None:
    """The run's ledger after `rounds` rounds against Flower 1.39's RdpAccountant (Google's
    dp-accounting: another implementation of the sampled Gaussian mechanism's RDP, with its
    own orders) for Poisson sampling at rate q, neighbours by adding or removing one client."""
    settings = settings_of({"num-clients": 100, "fraction-train": q,
                            "client-dp.noise-multiplier": z, "num-rounds": rounds})  # fmt: skip
    ledger = PrivacyLedger(settings)
    for _ in range(rounds):
        ledger.charge(CLIENTS)
    ours = ledger.metrics()[client_dp.EPSILON]
    sampling = SamplingMethod.POISSON if q < 1 else SamplingMethod.NO_AMPLIFICATION
    config = PrivacyConfig(1e-5, 100, NeighboringRelation.ADD_OR_REMOVE_ONE, sampling)
    flower = RdpAccountant(config)
    flower.compose(GaussianPrivacyEvent(z, round(q * 100), 100), rounds)
    assert ours == pytest.approx(flower.get_epsilon(1e-5), rel=0.01)
    mech = client_dp.mechanism(settings)
    assert mech is not None
    assert ours == pytest.approx(client_dp.planned_epsilon(mech, rounds))


@pytest.mark.parametrize(("z", "rounds"), [(1.0, 1), (1.0, 10), (2.0, 20), (4.0, 50)])
def test_without_sampling_epsilon_bounds_the_exact_gaussian_mechanism(
    z: float, rounds: int
) -> None:
    """T Gaussian releases at noise multiplier z are one at z / sqrt(T), whose exact (epsilon,
    delta) curve is known (Balle and Wang, ICML 2018, Thm. 8): delta(eps) = Phi(-eps/mu +
    mu/2) - e^eps Phi(-eps/mu - mu/2), mu = sqrt(T) / z. The RDP account is an upper bound,
    and a tight one (within 10 %)."""
    mu, normal = math.sqrt(rounds) / z, NormalDist()

    def delta(eps: float) -> float:
        return normal.cdf(-eps / mu + mu / 2) - math.exp(eps) * normal.cdf(-eps / mu - mu / 2)

    lo, hi = 0.0, 500.0
    for _ in range(200):
        lo, hi = ((lo + hi) / 2, hi) if delta((lo + hi) / 2) > 1e-5 else (lo, (lo + hi) / 2)
    ours = epsilon([(z, 1.0, rounds)], 1e-5)
    assert hi <= ours <= 1.1 * hi, (ours, hi)


def test_noise_on_the_clients_is_accounted_per_client_against_the_server() -> None:
    """Each client's own release: z / 2 (sensitivity 2C for replacing its data), no
    amplification; the round's figure is the largest over clients."""
    settings = settings_of({"num-clients": N, "client-dp.noise-multiplier": 2.0,
                            "client-dp.noise-at": "client"})  # fmt: skip
    ledger = PrivacyLedger(settings)
    for r in range(6):
        ledger.charge(CLIENTS[: 3 + (r % 2)])  # client 3 asked in every other round only
    assert ledger.released[0] == [(1.0, 1.0, 6)] and ledger.released[3] == [(1.0, 1.0, 3)]
    assert ledger.metrics()[client_dp.EPSILON] == pytest.approx(epsilon([(1.0, 1.0, 6)], 1e-5))
    again = PrivacyLedger(settings)
    again.load_state(json.loads(json.dumps(ledger.state())))  # through the checkpoint's JSON
    assert again.released == ledger.released


def test_a_resume_that_would_exceed_the_budget_is_refused() -> None:
    """10 rounds spent at z = 1, then a resume to 20 rounds at z = 4 (within the budget had
    every round been at 4): the ledger's past rounds count at their own noise."""
    first = settings_of({"num-clients": N, "num-rounds": 10, "client-dp.noise-multiplier": 1.0})
    ledger = PrivacyLedger(first)
    for _ in range(10):
        ledger.charge(CLIENTS)
    meta = json.loads(json.dumps(ledger.state()))
    resumed = settings_of({"num-clients": N, "num-rounds": 20, "client-dp.noise-multiplier": 4.0,
                           "client-dp.max-epsilon": 12.0})  # fmt: skip
    with pytest.raises(SettingsError, match=r"would spend epsilon 1\d\.\d+ .*above the budget"):
        PrivacyLedger(resumed).load_state(meta)
    within = {**resumed, "client-dp.max-epsilon": 30.0}
    PrivacyLedger(within).load_state(meta)  # 19.1 + a little: within 30


def test_a_target_epsilon_sets_the_noise_for_the_planned_rounds() -> None:
    settings = settings_of({"num-clients": 100, "fraction-train": 0.2, "num-rounds": 30,
                            "client-dp.target-epsilon": 3.0})  # fmt: skip
    mech = client_dp.mechanism(settings)
    assert mech is not None
    planned = client_dp.planned_epsilon(mech, 30)
    assert 2.98 <= planned <= 3.0
    at_clients = client_dp.mechanism({**settings, "client-dp.noise-at": "client"})
    assert at_clients is not None
    assert client_dp.planned_epsilon(at_clients, 30) == pytest.approx(
        epsilon([(at_clients.noise_multiplier / 2, 1.0, 30)], 1e-5)
    )
    assert client_dp.planned_epsilon(at_clients, 30) <= 3.0


# ---- the noisy mean in the strategies ----------------------------------------------------------


class Updates:
    """FedAvg's clients: each answers the model it got plus a fixed update of norm 0.3; client
    `big` (if any) plus `scale` times it."""

    def __init__(self, big: int | None = None, scale: float = 1.0) -> None:
        self.big, self.scale = big, scale

    def __call__(self, cid: int, _mtype: str, content: RecordDict) -> RecordDict:
        model = protocol.arrays_of(content)
        rng = np.random.default_rng(cid)
        out = {}
        for k, v in model.items():
            step = rng.standard_normal(v.shape)
            factor = self.scale if cid == self.big else 1.0
            out[k] = (v + factor * 0.3 * step / math.sqrt(sum(x.size for x in model.values())))
            out[k] = out[k].astype(v.dtype)
        return protocol.reply(content, cid, {protocol.NUM_EXAMPLES: 50}, arrays=out)


def _fedavg_round(run_config: dict[str, Any], answer: Updates, **extra: Any) -> FedAvg:
    strategy = FedAvg(settings_of({**run_config, "num-clients": N, **DP, **extra}))
    strategy.initialize(1)
    strategy.last_metrics = strategy.run_round(  # type: ignore[attr-defined]
        ScriptedFederation(strategy.settings, answer, CLIENTS)
    )
    return strategy


def test_one_client_moves_fedavgs_model_by_at_most_clip_over_m(run_config: dict[str, Any]) -> None:
    """Client 3 sends an update 10^6 times an honest one: with the same noise (reproducible),
    the model moves by at most clip / m from where the run with client 3 honest lands."""
    honest = _flat(_fedavg_round(run_config, Updates()).weights)
    for scale in (10.0, 1e6):
        attacked = _flat(_fedavg_round(run_config, Updates(big=3, scale=scale)).weights)
        assert np.linalg.norm(attacked - honest) <= 2 * 0.5 / N * (1 + 1e-4)  # replace: 2C/m
    plain = FedAvg(settings_of({**run_config, "num-clients": N}))
    plain.initialize(1)
    start = _flat(plain.weights)
    plain.run_round(ScriptedFederation(plain.settings, Updates(big=3, scale=1e6), CLIENTS))
    assert np.linalg.norm(_flat(plain.weights) - start) > 1e3  # the mean alone is dragged away


def test_noise_zero_and_a_bound_nobody_reaches_is_fedavgs_round_bit_for_bit(
    run_config: dict[str, Any],
) -> None:
    """The strategy's client-level DP path (fold, clip, fixed denominator m = N, release) with
    the mechanism's noise set to 0 and a bound of 10^12, against plain FedAvg's round on the same
    replies (equal example counts, so FedAvg's weights are equal too): the same model, bit for
    bit. (`client-dp.noise-multiplier=0` turns DP off, so the noise is set on the mechanism.)"""
    plain = FedAvg(settings_of({**run_config, "num-clients": N}))
    plain.initialize(1)
    plain.run_round(ScriptedFederation(plain.settings, Updates(), CLIENTS))
    private = FedAvg(settings_of({**run_config, "num-clients": N, **DP,
                                  "client-dp.clip": 1e12}))  # fmt: skip
    assert private.combiner.dp is not None and not private.combiner.plain
    private.combiner.dp = replace(private.combiner.dp, noise_multiplier=0.0)
    private.initialize(1)
    private.run_round(ScriptedFederation(private.settings, Updates(), CLIENTS))
    for key, value in plain.weights.items():
        assert private.weights[key].dtype == value.dtype
        np.testing.assert_array_equal(private.weights[key], value)


def test_the_noise_has_the_stated_std_and_the_denominator_is_fixed(
    run_config: dict[str, Any],
) -> None:
    """Noise std z C / m on every coordinate, with m = q N whatever the number of replies."""
    strategy = _fedavg_round(run_config, Updates(), **{"client-dp.noise-multiplier": 4.0})
    noiseless = _fedavg_round(run_config, Updates(), **{"client-dp.noise-multiplier": 1e-12})
    noise = _flat(strategy.weights) - _flat(noiseless.weights)
    assert abs(float(noise.std()) / (4.0 * 0.5 / N) - 1) < 0.02  # d ~ 4,000 coordinates
    # q = 0.5: the sum of the 10 replies is divided by 5 (the expected sample), not by 10
    settings = settings_of({**run_config, "num-clients": N, **DP, "fraction-train": 0.5,
                            "client-dp.noise-multiplier": 1e-12})  # fmt: skip
    half = FedAvg(settings)
    half.initialize(1)
    start = _flat(half.weights)
    half.run_round(ScriptedFederation(settings, Updates(), CLIENTS))  # all 10 answer
    np.testing.assert_allclose(_flat(half.weights) - start,
                               2 * (_flat(noiseless.weights) - start), rtol=1e-4, atol=1e-7)


def test_a_round_without_clients_releases_noise_only(run_config: dict[str, Any]) -> None:
    strategy = FedAvg(settings_of({**run_config, "num-clients": N, **DP}))
    strategy.initialize(1)
    start = _flat(strategy.weights)
    metrics = strategy.run_round(ScriptedFederation(strategy.settings, Updates(), []))
    moved = _flat(strategy.weights) - start
    assert metrics["clients"] == 0 and abs(float(moved.std()) / (1.0 * 0.5 / N) - 1) < 0.05


def test_fedem_clips_a_clients_components_together(run_config: dict[str, Any]) -> None:
    """FedEM's release moves by at most clip / m when one client's update of every component
    is huge: its M components are one update."""

    def components(big: bool) -> np.ndarray:
        settings = settings_of({**run_config, "algorithm": "fedem", "num-clients": N, **DP,
                                "client-dp.noise-multiplier": 1e-12})  # fmt: skip
        strategy = FedEM(settings)
        strategy.initialize(1)
        strategy.run_round(ScriptedFederation(settings, Updates(3 if big else None, 1e6),
                                              CLIENTS))  # fmt: skip
        return _flat(strategy.weights)

    assert np.linalg.norm(components(True) - components(False)) <= 2 * 0.5 / N * (1 + 1e-4)


def test_scaffold_clips_delta_y_and_delta_c_together(run_config: dict[str, Any]) -> None:
    """SCAFFOLD: x moves by the combined delta_y, c by (m / N) times the combined delta_c, and
    the pair, as one update, by at most clip / m for one client's huge delta_c."""

    def answer(big: bool) -> Any:
        def reply(cid: int, _mtype: str, content: RecordDict) -> RecordDict:
            x, c = protocol.arrays_of(content), protocol.arrays_of(content, CONTROL)
            rng = np.random.default_rng(cid)
            dy = {k: (0.01 * rng.standard_normal(v.shape)).astype(v.dtype) for k, v in x.items()}
            dc = {k: (0.01 * rng.standard_normal(v.shape)).astype(v.dtype) for k, v in c.items()}
            if big and cid == 3:
                dc = {k: v * 1e6 for k, v in dc.items()}
            return protocol.reply(content, cid, {protocol.NUM_EXAMPLES: 50}, arrays=dy,
                                  **{CONTROL_DELTA: dc})  # fmt: skip

        return reply

    def release(big: bool) -> np.ndarray:
        settings = settings_of({**run_config, "algorithm": "scaffold", "num-clients": N, **DP,
                                "client-dp.noise-multiplier": 1e-12})  # fmt: skip
        strategy = Scaffold(settings)
        strategy.initialize(1)
        x0, c0 = _flat(strategy.weights), _flat(strategy.control)
        strategy.run_round(ScriptedFederation(settings, answer(big), CLIENTS))
        m = strategy.combiner.denominator
        moved = (_flat(strategy.weights) - x0, (_flat(strategy.control) - c0) * N / m)
        return np.concatenate(moved)

    assert np.linalg.norm(release(True) - release(False)) <= 2 * 0.5 / N * (1 + 1e-4)


def test_adaptive_clipping_moves_the_bound_and_checkpoints_it(run_config: dict[str, Any]) -> None:
    """Every update (norm 0.3) fits under the first bound 0.5: the released unclipped share is
    about 1 > 0.5, so the bound shrinks by about exp(-0.2 x 0.5); it travels in the
    checkpoint's meta."""
    extra = {"client-dp.target-quantile": 0.5, "client-dp.count-std": 5.0,
             "client-dp.noise-multiplier": 0.5}  # fmt: skip
    strategy = _fedavg_round(run_config, Updates(), **extra)
    metrics = strategy.last_metrics  # type: ignore[attr-defined]
    assert metrics[client_dp.CLIP] == 0.5
    share = metrics[client_dp.UNCLIPPED]
    assert strategy.combiner.clip == pytest.approx(0.5 * math.exp(-0.2 * (share - 0.5)))
    _, meta = strategy.state()
    again = FedAvg(strategy.settings)
    again.load_state(strategy.weights, json.loads(json.dumps(meta)))
    assert again.combiner.clip == strategy.combiner.clip != 0.5


def test_noise_on_the_clients_lets_any_rule_combine_and_counts_each_client_once() -> None:
    models = {c: {"w": np.full(3, float(c), np.float32)} for c in range(5)}
    ref = {"w": np.zeros(3, np.float32)}
    mean = Combiner(settings_of({"num-clients": 5, "client-dp.noise-multiplier": 1.0,
                                 "client-dp.noise-at": "client"}))  # fmt: skip
    acc = mean.accumulator(1, "model", ref)
    assert acc is not None
    for c, m in models.items():
        acc.add(m, 1e6 if c == 4 else 1.0)  # a huge claim counts once
    np.testing.assert_allclose(acc.result()["w"], 2.0)
    median = Combiner(settings_of({"num-clients": 5, "client-dp.noise-multiplier": 1.0,
                                   "client-dp.noise-at": "client", "robust.rule": "median",
                                   "robust.f": 1}))  # fmt: skip
    assert median.accumulator(1, "model", ref) is None
    np.testing.assert_allclose(median.combine(1, "model", models, ref)["w"], 2.0)


def test_robust_clipping_and_client_level_dp_share_one_bound(run_config: dict[str, Any]) -> None:
    """robust.clip below client-dp.clip: every update is clipped to the smaller bound, and the
    noise is calibrated to it (the sensitivity is the bound actually enforced)."""
    strategy = _fedavg_round(run_config, Updates(big=3, scale=1e6), **{"robust.clip": 0.1})
    metrics = strategy.last_metrics  # type: ignore[attr-defined]
    assert metrics[client_dp.CLIP] == 0.1
    assert metrics[client_dp.NOISE_STD] == pytest.approx(1.0 * 0.1 / N)


def test_simulated_attackers_are_clipped_like_everyone(run_config: dict[str, Any]) -> None:
    """Under client-level DP with the noise on the server (the mean, sound), two sign-flipping
    clients with a 10^6 boost move the model by at most 2 x 2C / m from the honest run: the
    clipping that bounds a client's privacy loss bounds its influence too."""
    honest = _flat(_fedavg_round(run_config, Updates()).weights)
    attack = {"attack.clients": "8,9", "attack.kind": "sign-flip", "attack.scale": 1e6}
    attacked = _fedavg_round(run_config, Updates(), **attack)
    assert attacked.last_metrics["attackers"] == 2.0  # type: ignore[attr-defined]
    assert np.linalg.norm(_flat(attacked.weights) - honest) <= 2 * 2 * 0.5 / N * (1 + 1e-4)


# ---- before start-up -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"algorithm": "fedlrt"}, "fedlrt refuses client-level DP .a round releases three"),
        ({"algorithm": "clustered"}, "split decision reads each client's update"),
        ({"algorithm": "fedsc"}, "correlation matrices"),
        ({"algorithm": "adept-ae"}, "learns sigma"),
        ({"client-dp.target-epsilon": 2.0}, "both set"),
        ({"robust.rule": "median", "robust.f": 1}, "robust.rule=median with client-level DP"),
        ({"robust.clip-quantile": 0.5}, "Use client-dp.target-quantile"),
        ({"robust.nnm": True, "robust.f": 1}, "robust.nnm / robust.bucket"),
        ({"fraction-train": 0.5, "min-train-clients": 3}, "Poisson sampling"),
        ({"fraction-train": 0.0}, "fraction-train=0"),
        ({"client-dp.noise-at": "client", "client-dp.target-quantile": 0.5},
         "only the server can noise"),
        ({"client-dp.target-quantile": 0.5, "client-dp.noise-multiplier": 2.0},
         "count's noise above 1"),
        ({"client-dp.max-epsilon": 5.0}, r"would spend epsilon 3\d\.\d \(delta 1e-05\), above"),
        ({"client-dp.noise-multiplier": 0.0, "client-dp.target-epsilon": 1e-4},
         "no noise multiplier reaches"),
    ],
)
def test_settings_client_dp_cannot_honour_are_refused_in_one_line(
    settings: dict[str, Any], message: str
) -> None:
    with pytest.raises(SettingsError, match=message) as info:
        resolve({"num-clients": N, "num-rounds": 20, "client-dp.noise-multiplier": 1.0,
                 **settings})  # fmt: skip
    assert "\n" not in str(info.value)


def test_each_algorithm_takes_client_dp_or_says_why_not() -> None:
    for name, spec in ALGORITHMS.items():
        cfg = {"algorithm": name, "num-clients": N, "client-dp.noise-multiplier": 1.0}
        if spec.client_dp:
            resolve(cfg)
            assert foreign_settings(name, ["client-dp.clip"]) == {}
        else:
            assert spec.client_dp_note, name
            with pytest.raises(SettingsError, match="refuses client-level DP"):
                resolve(cfg)
            # `pollen settings` does not list client-dp.* for it; the command line names them
            assert "fedavg" in foreign_settings(name, ["client-dp.clip"])["client-dp.clip"]


def test_within_the_budget_a_run_starts() -> None:
    cfg = resolve({"num-clients": N, "num-rounds": 20, "client-dp.noise-multiplier": 4.0,
                   "client-dp.max-epsilon": 8.0})  # fmt: skip
    mech = client_dp.mechanism(cfg)
    assert mech is not None and client_dp.planned_epsilon(mech, 20) < 8.0


# ---- through the real ServerApp and ClientApp ------------------------------------------------


def test_a_poisson_sample_may_be_empty_and_the_run_goes_on(
    tmp_path: Path, shared_cache: Path
) -> None:
    """fraction-train 0.1 of 10 clients, each sampled on its own: some rounds ask nobody (the
    engine's generator, seeded: reproducible), they release noise, the run completes and its
    summary states the guarantee with the epsilon of its ledger."""
    summary = run_in_process(tmp_path, shared_cache, "poisson", {
        "num-clients": N, "fraction-train": 0.1, "num-rounds": 8, **DP,
        "client-dp.noise-multiplier": 0.01,
    })  # fmt: skip
    rows = [json.loads(line) for line in (tmp_path / "poisson" / "metrics.jsonl").open()]
    sizes = [r["train"]["clients"] for r in rows]
    assert 0.0 in sizes and max(sizes) >= 1 and len(set(sizes)) > 1, sizes
    level = summary["privacy"]["client-level"]
    assert level["epsilon"] == pytest.approx(epsilon([(0.01, 0.1, 8)], 1e-5))
    assert level["sample-rate"] == 0.1 and level["noise-at"] == "server"
    assert "example-level" not in summary["privacy"]


@pytest.mark.slow
def test_fedavg_with_client_level_dp_learns_and_reports_both_guarantees(
    tmp_path: Path, shared_cache: Path
) -> None:
    """mnist-5k, 100 clients (all per round), z = 0.5 at clip 1: far above chance, a few points
    below the run without DP; with DP-SGD on too, the summary states both guarantees."""
    base = {"dataset": "mnist-5k", "num-clients": 100, "num-rounds": 5, "batch-size": 16}
    clean = run_in_process(tmp_path, shared_cache, "clean", base)
    private = run_in_process(tmp_path, shared_cache, "private", {
        **base, "client-dp.noise-multiplier": 0.5, "client-dp.clip": 1.0,
    })  # fmt: skip
    acc = [s["final"]["eval"]["test-accuracy"] for s in (clean, private)]
    assert acc[0] > 0.7 and acc[0] - 0.1 < acc[1], acc
    eps = private["privacy"]["client-level"]["epsilon"]
    assert eps == pytest.approx(epsilon([(0.5, 1.0, 5)], 1e-5))
    both = run_in_process(tmp_path, shared_cache, "both", {
        **base, "num-rounds": 1, "client-dp.noise-multiplier": 2.0, "dp.noise-multiplier": 1.0,
    })  # fmt: skip
    assert set(both["privacy"]) == {"client-level", "example-level"}
    assert both["privacy"]["example-level"]["epsilon"] > 0


def test_the_summary_states_each_guarantee_and_fedsc_adds_dp_calr(
    run_config: dict[str, Any],
) -> None:
    from server.summary import privacy_summary
    from strategies.fedsc import FedSC

    settings = settings_of({"num-clients": N, "client-dp.noise-multiplier": 1.0,
                            "dp.noise-multiplier": 1.0})  # fmt: skip
    train = {client_dp.EPSILON: 3.5, "epsilon": 1.25}
    out = privacy_summary(settings, train, {"correlations": {"epsilon": 2.0}})["privacy"]
    assert out["client-level"]["epsilon"] == 3.5 and out["example-level"]["epsilon"] == 1.25
    assert out["correlations"] == {"epsilon": 2.0}
    assert privacy_summary(settings_of({"num-clients": N}), {}) == {}
    fedsc = FedSC(settings_of({**run_config, "algorithm": "fedsc", "fedsc.noise-std": 0.1}))
    fedsc.releases, fedsc.sizes = {0: 3}, {0: 100}
    own = fedsc.privacy_guarantees()["correlations"]
    assert own["mechanism"] == "DP-CalR" and own["epsilon"] == fedsc._ledger()["epsilon"] > 0
