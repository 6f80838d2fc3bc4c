"""A run's settings: the common ones (pollen.core.settings, pollen.core.protection) and every
algorithm's (each in its contract module, named by its registry entry), resolved against their
defaults and checked, alone and together, before anything starts."""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable, Mapping
from typing import Any

from pollen.core.contracts.adept import AdeptAESettings
from pollen.core.contracts.fedlrt import FeDLRTSettings
from pollen.core.contracts.fedsc import FedSCSettings
from pollen.core.pacing import PROFILES, AsyncSettings, HeterogeneitySettings, RoundSettings
from pollen.core.protection import (
    AttackSettings,
    ClientDPSettings,
    DPSettings,
    RobustSettings,
    SecAggSettings,
)
from pollen.core.registry import ALGORITHMS, AlgorithmSpec
from pollen.core.settings import (
    FrozenSettings,
    RunSettings,
    Scalar,
    Setting,
    SettingsError,
    SettingsKey,
    SyntheticSettings,
    kept,
    settings_key,
)
from robust.client_dp import count_std, update_noise_multiplier
from robust.rules import breakdown_note, clients_needed

COMMON_SETTINGS: tuple[Setting, ...] = (
    RunSettings.declarations()
    + SyntheticSettings.declarations()
    + DPSettings.declarations()
    + ClientDPSettings.declarations()
    + SecAggSettings.declarations()
    + RobustSettings.declarations()
    + AttackSettings.declarations()
    + RoundSettings.declarations()
    + AsyncSettings.declarations()
    + HeterogeneitySettings.declarations()
)
"""Every setting a run has whatever its algorithm; each algorithm declares its own in its
contract module (a SettingsGroup) named by its registry entry."""


def _by_key(settings: Iterable[Setting]) -> dict[str, Setting]:
    out: dict[str, Setting] = {}
    for s in settings:
        if s.key in out:
            raise ValueError(f"setting '{s.key}' declared twice")
        out[s.key] = s
    return out


def all_settings() -> dict[str, Setting]:
    """Every declared setting: the common ones and each algorithm's own."""
    declared: list[Setting] = list(COMMON_SETTINGS)
    for spec in ALGORITHMS.values():
        declared.extend(spec.settings)
    return _by_key(declared)


def defaults() -> dict[str, Scalar]:
    return {key: s.default for key, s in all_settings().items()}


def resolve(
    overrides: Mapping[str, Any], base: Mapping[str, Any] | None = None
) -> dict[str, Scalar]:
    """Defaults, then `base`, then `overrides`; every key known, every value checked."""
    declared = all_settings()
    out: dict[str, Scalar] = {k: s.default for k, s in declared.items()}
    for layer in (base or {}, overrides):
        for key, value in layer.items():
            if key not in declared:
                raise SettingsError(f"unknown setting '{key}'{_closest(key, declared)}")
            out[key] = declared[key].coerce(value)
    _check_consistency(out)
    return out


def _check_consistency(cfg: Mapping[str, Scalar]) -> None:
    if cfg["algorithm"] not in ALGORITHMS:
        raise SettingsError(
            f"unknown algorithm {cfg['algorithm']!r}{_closest(str(cfg['algorithm']), ALGORITHMS)}"
            f"; known: {', '.join(sorted(ALGORITHMS))}"
        )
    spec = ALGORITHMS[str(cfg["algorithm"])]
    if cfg["amp"] and not spec.amp:
        supported = _takers("amp")
        raise SettingsError(
            f"amp=true: {spec.name} trains in float32 only (docs/deployment.md#gpu); "
            f"mixed precision is for {supported}"
        )
    _check_dp(cfg, spec)
    _check_robust(cfg, spec)
    _check_client_dp(cfg, spec)
    _check_secagg(cfg, spec)
    _check_pacing(cfg)
    _check_buffered(cfg, spec)
    if int(cfg["local-steps"]) > 0 and not spec.local_steps:
        supported = _takers("local_steps")
        raise SettingsError(
            f"local-steps={cfg['local-steps']}: {spec.name} counts its local work in "
            f"local-epochs only; local-steps is for {supported}"
        )
    _check_true_decoder(cfg)
    _check_fedsc_noise(cfg, spec)
    if float(cfg["val-fraction"]) + float(cfg["test-fraction"]) >= 0.95:
        raise SettingsError("val-fraction + test-fraction must leave data to train on (< 0.95)")
    if int(cfg["min-replies"]) > int(cfg["num-clients"]):
        raise SettingsError(
            f"min-replies ({cfg['min-replies']}) exceeds num-clients ({cfg['num-clients']})"
        )
    if int(cfg["min-available-clients"]) > int(cfg["num-clients"]):
        raise SettingsError(
            f"min-available-clients ({cfg['min-available-clients']}) exceeds "
            f"num-clients ({cfg['num-clients']})"
        )


def _check_pacing(cfg: Mapping[str, Scalar]) -> None:
    """A device profile other than the built-in ones is a CSV file, read where the server runs
    (pacing.devices). (Over-selection with client-level DP is accounted at twice the
    sensitivity: pollen.core.contracts.client_dp.)"""
    het = HeterogeneitySettings.of(cfg)
    if het.profile in PROFILES[1:] or not het.enabled:
        return
    if not het.profile.endswith(".csv"):
        raise SettingsError(
            f"heterogeneity.profile={het.profile!r}: not one of {', '.join(PROFILES)} nor a "
            ".csv file"
        )


def _check_buffered(cfg: Mapping[str, Scalar], spec: AlgorithmSpec) -> None:
    """Buffered asynchronous aggregation (FedBuff) only where the server half folds buffers,
    and without what needs a round's clients together (docs/pacing.md#buffered-asynchronous-
    aggregation)."""
    if not AsyncSettings.of(cfg).enabled:
        return
    if not spec.buffered:
        raise SettingsError(
            f"async.buffer={cfg['async.buffer']}: {spec.name} refuses buffered asynchronous "
            f"aggregation ({spec.buffered_note}); it is for {_takers('buffered')}"
        )
    training = RunSettings.of(cfg).training_clients
    if AsyncSettings.of(cfg).buffer > training:
        raise SettingsError(
            f"async.buffer={cfg['async.buffer']} exceeds the {training} clients that train: a "
            "model version takes at most one reply of each client"
        )
    if RoundSettings.of(cfg).enabled:
        raise SettingsError(
            "round.deadline / round.over-selection with async.buffer: refused; they pace "
            "synchronous rounds, and under FedBuff no round waits for anyone"
        )
    if SecAggSettings.of(cfg).enabled:
        raise SettingsError(
            "secagg.enabled=true with async.buffer: refused; SecAgg+ fixes its clients before "
            "they train, and a buffer's clients are known only as their replies come"
        )
    if "fedem" in spec.setting_groups() and cfg.get("fedem.unseen-protocol") == "one-step":
        raise SettingsError(
            "fedem.unseen-protocol=one-step with async.buffer: refused; it evaluates the "
            "unseen clients between rounds, which buffered versions do not have; "
            "'converge' (at the final evaluation) runs"
        )


def _takers(flag: str) -> str:
    """The algorithms whose registry entry has `flag` (amp, dp, client_dp, ...), named."""
    return ", ".join(sorted(n for n, a in ALGORITHMS.items() if getattr(a, flag)))


def _check_dp(cfg: Mapping[str, Scalar], spec: AlgorithmSpec) -> None:
    """DP-SGD only where the clients' training supports it, one way of setting its noise, and
    not with mixed precision."""
    dp = DPSettings.of(cfg)
    if not dp.enabled:
        return
    if not spec.dp:
        supported = _takers("dp")
        raise SettingsError(
            f"dp.noise-multiplier / dp.target-epsilon: {spec.name} has no DP-SGD training "
            f"(docs/privacy.md); DP-SGD is for {supported}"
        )
    if dp.noise_multiplier > 0 and dp.target_epsilon > 0:
        raise SettingsError(
            "dp.noise-multiplier and dp.target-epsilon both set: give one (the noise, or the "
            "epsilon the noise is calibrated to)"
        )
    if cfg["amp"]:
        raise SettingsError(
            "amp=true with DP-SGD: refused; per-example gradients are clipped and noised in "
            "float32 (docs/privacy.md)"
        )
    if cfg["drop-last"]:
        raise SettingsError(
            "drop-last=true with DP-SGD: refused; Poisson-sampled batches have no last batch to "
            "drop (docs/privacy.md)"
        )
    if int(cfg["local-steps"]) > 0:
        raise SettingsError(
            f"local-steps={cfg['local-steps']} with DP-SGD: refused; DP-SGD's steps are "
            "local-epochs passes of Poisson-sampled batches, which its privacy accounting counts "
            "(docs/privacy.md)"
        )


def _check_client_dp(cfg: Mapping[str, Scalar], spec: AlgorithmSpec) -> None:
    """Client-level DP only where the algorithm's aggregation has a stated sensitivity, one
    way of setting its noise, robust rules only where they are post-processing (noise on the
    clients), Poisson sampling that honours no minimum, and a planned epsilon within the
    budget (docs/privacy.md#client-level-dp)."""
    dp = ClientDPSettings.of(cfg)
    if not dp.enabled:
        return
    if not spec.client_dp:
        supported = _takers("client_dp")
        raise SettingsError(
            f"client-dp: {spec.name} refuses client-level DP ({spec.client_dp_note}); it is for "
            f"{supported}"
        )
    if dp.noise_multiplier > 0 and dp.target_epsilon > 0:
        raise SettingsError(
            "client-dp.noise-multiplier and client-dp.target-epsilon both set: give one (the "
            "noise, or the epsilon the noise is calibrated to)"
        )
    run, robust = RunSettings.of(cfg), RobustSettings.of(cfg)
    distributed = dp.noise_at == "client" and SecAggSettings.of(cfg).enabled
    if dp.noise_at == "client" and not distributed:
        if dp.adaptive:
            raise SettingsError(
                "client-dp.target-quantile with client-dp.noise-at=client: refused; adaptive "
                "clipping releases the noised count of unclipped updates, which only the server "
                "can noise (a client's own bit would reach it in the clear)"
            )
    else:
        if not distributed:  # (secure aggregation refuses these for its own reasons)
            _check_server_noise(robust)
        if not AsyncSettings.of(cfg).enabled:  # (FedBuff samples no one)
            _check_poisson(run)
    from pollen.core.contracts import client_dp  # lazy: opacus

    try:
        mech = client_dp.mechanism(cfg)
        assert mech is not None  # enabled
        if dp.adaptive:
            update_noise_multiplier(mech.noise_multiplier,
                                    count_std(mech.denominator, dp.count_std))  # fmt: skip
        planned = client_dp.planned_epsilon(mech, run.num_rounds)
    except ValueError as exc:
        raise SettingsError(f"client-dp: {exc}") from None
    if dp.max_epsilon > 0 and planned > dp.max_epsilon:
        raise SettingsError(
            f"client-dp: {run.num_rounds} rounds at noise multiplier "
            f"{mech.noise_multiplier:.4g} would spend epsilon {planned:.3g} (delta "
            f"{dp.delta:g}), above the budget client-dp.max-epsilon={dp.max_epsilon:g}; lower "
            "num-rounds, raise client-dp.noise-multiplier or give client-dp.target-epsilon"
        )


def _check_poisson(run: RunSettings) -> None:
    """Client-level DP's rounds sample each client independently with probability
    fraction-train (Poisson sampling, as the privacy analysis assumes)."""
    if run.fraction_train <= 0:
        raise SettingsError(
            "client-level DP with fraction-train=0: each client takes part in a round with "
            "probability fraction-train; give it above 0"
        )
    if run.fraction_train < 1 and run.min_train_clients > 1:
        raise SettingsError(
            f"min-train-clients={run.min_train_clients} with client-level DP and "
            f"fraction-train={run.fraction_train:g}: refused; clients are sampled "
            "independently (Poisson sampling, as the privacy analysis assumes), which "
            "honours no minimum"
        )


def _check_server_noise(robust: RobustSettings) -> None:
    """With the noise on the server, nothing but the mean around the noisy sum."""
    if robust.rule != "mean":
        raise SettingsError(
            f"robust.rule={robust.rule} with client-level DP noised on the server: refused; "
            "the noise is calibrated to a mean that one client moves by at most clip / m, "
            f"which {robust.rule} does not guarantee. Use client-dp.noise-at=client (any "
            "rule is then post-processing of noised updates) or robust.rule=mean"
        )
    if robust.clip_quantile > 0:
        raise SettingsError(
            "robust.clip-quantile with client-level DP noised on the server: refused; the "
            "bound would be read from the updates un-noised. Use client-dp.target-quantile "
            "(adaptive clipping with a noised count)"
        )
    if robust.nnm or robust.bucket > 1:
        raise SettingsError(
            "robust.nnm / robust.bucket with client-level DP noised on the server: refused; "
            "they mix clients' updates before the noisy sum, so one client would move "
            "several of its terms"
        )


def _check_secagg(cfg: Mapping[str, Scalar], spec: AlgorithmSpec) -> None:
    """Secure aggregation only where every combination of clients is a sum, with nothing that
    reads one client's update (a robust rule, the server's pre-aggregation, the simulated
    attackers, adaptive clipping's count, a warm start from one client), with at least two
    clients a round, and a modulus the sum can never wrap (docs/security.md)."""
    if not SecAggSettings.of(cfg).enabled:
        return
    if not spec.secagg:
        supported = _takers("secagg")
        raise SettingsError(
            f"secagg.enabled=true: {spec.name} refuses secure aggregation ({spec.secagg_note}); "
            f"it is for {supported}"
        )
    robust, attack = RobustSettings.of(cfg), AttackSettings.of(cfg)
    why = "under secure aggregation the server sees only the clients' sum (docs/security.md)"
    if robust.rule != "mean":
        raise SettingsError(
            f"robust.rule={robust.rule} with secagg.enabled=true: refused; a robust rule reads "
            f"every client's update, and {why}. Clipping can stay: robust.clip is then done "
            "by each client"
        )
    if robust.clip_quantile > 0 or robust.nnm or robust.bucket > 1:
        raise SettingsError(
            "robust.clip-quantile / robust.nnm / robust.bucket with secagg.enabled=true: "
            f"refused; they read or mix the clients' updates one by one, and {why}"
        )
    if attack.ids() and attack.kind != "label-flip":
        raise SettingsError(
            f"attack.kind={attack.kind} with secagg.enabled=true: refused; simulated attackers "
            f"replace their updates at the server, and {why}; label-flip (in the clients) and "
            "a node's own attack (pollen client --attack) still run"
        )
    if ClientDPSettings.of(cfg).adaptive:
        raise SettingsError(
            "client-dp.target-quantile with secagg.enabled=true: refused; adaptive clipping "
            "reads whether each client's update was clipped"
        )
    if "fedlrt" in spec.setting_groups() and FeDLRTSettings.of(cfg).warm_start > 0:
        raise SettingsError(
            "fedlrt.warm-start with secagg.enabled=true: refused; the warm start trains on one "
            "client and sends its model back whole, which no sum can hide"
        )
    run, dp = RunSettings.of(cfg), ClientDPSettings.of(cfg)
    poisson = dp.enabled and run.fraction_train < 1
    expected = run.fraction_train * run.training_clients if poisson else expected_round_clients(cfg)
    if expected < 2:
        raise SettingsError(
            f"secagg.enabled=true with {expected:g} clients a round: secure aggregation sums "
            "two clients at least (a sum of one is that client's update); raise "
            "fraction-train or num-clients"
        )
    s = SecAggSettings.of(cfg)
    if expected < s.fewest():
        raise SettingsError(
            f"secagg.enabled=true with {expected:g} clients a round: each client sums with "
            f"{s.fewest()} at least (secagg.min-clients, at least secagg.collusion + 2); raise "
            "fraction-train or num-clients"
        )
    from pollen.core.contracts import secagg  # lazy: the secagg package's encoding

    try:
        s.graph_for(max(int(expected), 2))
    except ValueError as exc:
        named = [f"secagg.{key}={value:g}" for key, value in
                 (("degree", s.degree), ("collusion", s.collusion), ("dropout", s.dropout))
                 if value]  # fmt: skip
        raise SettingsError(f"{', '.join(named) or 'secagg.enabled=true'}: {exc}") from None
    secagg.modulus_bits(cfg)


def expected_round_clients(cfg: Mapping[str, Scalar]) -> int:
    """How many clients a round samples when every training client is connected (the
    engine's sampling: max(min-train-clients, ceil(fraction-train x pool)), at most the pool)."""
    run = RunSettings.of(cfg)
    pool = run.training_clients
    want = max(run.min_train_clients, math.ceil(run.fraction_train * pool))
    return min(want, pool)


def _check_robust(cfg: Mapping[str, Scalar], spec: AlgorithmSpec) -> None:
    """A robust rule the algorithm takes, sized for the clients a round will have; attackers
    that exist and train; a label-flip attack only where clients train on labels."""
    robust, attack = RobustSettings.of(cfg), AttackSettings.of(cfg)
    if robust.rule not in spec.robust_rules:
        raise SettingsError(
            f"robust.rule={robust.rule}: {spec.name} takes {', '.join(spec.robust_rules)} "
            f"only ({spec.robust_note}; docs/robustness.md)"
        )
    if spec.robust_rules == ("mean",) and (
        robust.clip > 0 or robust.clip_quantile > 0 or robust.nnm or robust.bucket > 1
    ):
        raise SettingsError(
            f"robust.clip / clip-quantile / nnm / bucket: {spec.name} refuses them "
            f"({spec.robust_note})"
        )
    n = expected_round_clients(cfg)
    need = clients_needed(robust.rule, robust.f, robust.bucket, robust.nnm)
    if n < need:
        per = f" (in buckets of {robust.bucket})" if robust.bucket > 1 else ""
        mixing = " and more than f for robust.nnm" if robust.nnm else ""
        raise SettingsError(
            f"robust.rule={robust.rule} with robust.f={robust.f} needs "
            f"{breakdown_note(robust.rule)}{mixing}, i.e. at least {need} updates a round{per}, "
            f"but a round has {n} clients; lower robust.f or sample more clients"
        )
    ids = attack.ids()
    if not ids:
        return
    run = RunSettings.of(cfg)
    pool = run.training_clients
    outside = [i for i in ids if i >= pool]
    if outside:
        raise SettingsError(
            f"attack.clients: {outside} are not training clients (ids 0 to {pool - 1})"
        )
    if attack.kind == "label-flip" and not spec.labels:
        raise SettingsError(
            f"attack.kind=label-flip: {spec.name} trains without labels; choose an attack on "
            "the updates (sign-flip, gaussian, alie, ...)"
        )
    if spec.robust_rules == ("mean",):
        raise SettingsError(
            f"attack.clients: {spec.name} has nothing to attack ({spec.robust_note})"
        )


def _check_fedsc_noise(cfg: Mapping[str, Scalar], spec: AlgorithmSpec) -> None:
    """DP-CalR's noise shared out in a sum needs the secure sum, and noise to share."""
    fedsc = FedSCSettings.of(cfg)
    if "fedsc" not in spec.setting_groups() or fedsc.noise_at != "sum":
        return
    if not SecAggSettings.of(cfg).enabled:
        raise SettingsError(
            "fedsc.noise-at=sum shares DP-CalR's noise out in the secure sum of the matrices: "
            "give secagg.enabled=true (without it, each release carries its own noise: "
            "fedsc.noise-at=client)"
        )
    if fedsc.noise_std <= 0:
        raise SettingsError(
            "fedsc.noise-at=sum shares out fedsc.noise-std, which is 0: give the noise the sum "
            "of a sharing round's matrices is to carry"
        )


def _check_true_decoder(cfg: Mapping[str, Scalar]) -> None:
    """adept-ae.init-decoder=truth needs the generator's decoders: dataset ae-synthetic, and a
    latent size equal to theirs."""
    if AdeptAESettings.of(cfg).init_decoder != "truth":
        return
    run, synthetic = RunSettings.of(cfg), SyntheticSettings.of(cfg)
    if run.dataset != "ae-synthetic":
        raise SettingsError(
            f"adept-ae.init-decoder=truth starts each decoder at the client's true generator, "
            f"which only dataset 'ae-synthetic' has (dataset is {run.dataset!r})"
        )
    if AdeptAESettings.of(cfg).latent != synthetic.rank:
        raise SettingsError(
            f"adept-ae.init-decoder=truth: adept-ae.latent ({AdeptAESettings.of(cfg).latent}) "
            f"must equal the generator's latent size synthetic.rank ({synthetic.rank})"
        )


def _closest(name: str, known: Iterable[str]) -> str:
    """' (did you mean X?)' for the nearest known names, or ''."""
    names = list(known)
    close = difflib.get_close_matches(name, names, n=2, cutoff=0.6)
    close += [k for k in names if k.split(".")[-1] == name.split(".")[-1] and k not in close]
    return f" (did you mean {' or '.join(close[:3])}?)" if close else ""


def model_round(algorithm: str, key: str, rnd: int) -> int:
    """The round whose model a client metric `key` of round `rnd`'s training reply describes
    (0: the initial model), where reports and TensorBoard place it. Evaluation metrics (test-*,
    a -test- part, *accuracy*) describe the model the client received unless the algorithm
    evaluates after training (`AlgorithmSpec.evaluates_received`); the others (train-loss, ...)
    the round's training. An algorithm this version does not know counts as evaluating the
    received model."""
    spec = ALGORITHMS.get(algorithm)
    received = spec.evaluates_received if spec is not None else True
    evaluation = not key.startswith("train-") and (
        key.startswith("test-") or "-test-" in key or "accuracy" in key
    )
    return rnd - 1 if evaluation and received else rnd


def foreign_settings(algorithm: str, keys: Iterable[str]) -> dict[str, list[str]]:
    """The keys among `keys` that `algorithm` does not read, each with the algorithms that do
    (`fedprox.mu` for `fedavg`: ['fedprox']). Common settings belong to every algorithm, except
    `dp.*` (to the algorithms with DP-SGD) and `client-dp.*` (with client-level DP)."""
    spec = ALGORITHMS.get(algorithm)
    if spec is None:
        return {}
    mine = spec.setting_groups()
    # synthetic.* too, though it has a prefix
    private = DPSettings.declarations() + ClientDPSettings.declarations()
    common = {s.key for s in COMMON_SETTINGS} - {s.key for s in private}
    out: dict[str, list[str]] = {}
    for key in keys:
        group = key.split(".")[0] if "." in key else None
        if group is None or group in mine or key in common:
            continue
        out[key] = sorted(n for n, a in ALGORITHMS.items() if group in a.setting_groups())
    return out


def from_run_config(run_config: Mapping[str, Any]) -> dict[str, Scalar]:
    """Settings of a running app: Flower's run config, checked like CLI input (once per run
    and process: an app reads them with every message), and never changed."""
    declared = all_settings()
    known = {k: v for k, v in run_config.items() if k in declared}
    return kept(_RESOLVED, settings_key(known), lambda: FrozenSettings(resolve(known)))


_RESOLVED: dict[SettingsKey, FrozenSettings] = {}
