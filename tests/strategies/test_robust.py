"""The Combiner (strategies.robust): the robust rules and the simulated attackers at an
aggregation point, the refusals before start-up, and learning under attack through the real
ServerApp and ClientApp for the algorithms whose strategies call it here (FedAvg, FedProx,
FedEM, SCAFFOLD, Clustered FL, D-FedEM)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pollen.core.runconfig import resolve
from pollen.core.settings import SettingsError
from robust import rules
from strategies.robust import Combiner, TooFewReplies
from tests.fakes import run_in_process


def _combiner(**settings: Any) -> Combiner:
    return Combiner(resolve({"num-clients": 12, **settings}))


def _models(n: int, seed: int = 0) -> dict[int, dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return {
        c: {"w": rng.normal(size=(3, 4)).astype(np.float32), "n": np.array([c], dtype=np.int64)}
        for c in range(n)
    }


REFERENCE: dict[str, np.ndarray] = {"w": np.zeros((3, 4), np.float32), "n": np.zeros(1, np.int64)}


def test_the_default_is_the_plain_mean_and_anything_else_is_not() -> None:
    assert _combiner().plain
    for extra in ({"robust.rule": "median"}, {"robust.clip": 1.0}, {"robust.nnm": True},
                  {"robust.bucket": 2}, {"robust.clip-quantile": 0.5},
                  {"attack.clients": "3"}):  # fmt: skip
        assert not _combiner(**extra).plain, extra
    # a label-flip attack happens in the clients: the server's mean stays the plain one
    assert _combiner(**{"attack.clients": "3", "attack.kind": "label-flip"}).plain


def test_mean_weighs_claims_and_keeps_dtypes() -> None:
    models = _models(5)
    weights = {c: float(c + 1) for c in models}
    out = _combiner(**{"attack.clients": "11"}).combine(1, "m", models, REFERENCE, weights)
    expected = sum(weights[c] * models[c]["w"].astype(np.float64) for c in models) / 15.0
    np.testing.assert_allclose(out["w"], expected, rtol=1e-6)
    assert out["w"].dtype == np.float32 and out["n"].dtype == np.int64
    assert out["n"][0] == round(sum(weights[c] * c for c in models) / 15.0)


@pytest.mark.parametrize("rule", ["median", "trimmed-mean", "krum", "multi-krum", "geomed"])
def test_robust_rules_ignore_claimed_sizes(rule: str) -> None:
    models = _models(7)
    combiner = _combiner(**{"robust.rule": rule, "robust.f": 2})
    honest = combiner.combine(1, "m", models, REFERENCE, dict.fromkeys(models, 100.0))
    claims = {**dict.fromkeys(models, 100.0), 3: 1e6}
    np.testing.assert_array_equal(combiner.combine(1, "m", models, REFERENCE, claims)["w"],
                                  honest["w"])  # fmt: skip


def test_with_clipping_a_huge_claim_weighs_no_more_than_the_median_claim() -> None:
    models = _models(5)
    models[4]["w"] = np.full((3, 4), 0.5, np.float32)  # within the clip: only its weight counts
    combiner = _combiner(**{"robust.clip": 100.0})
    claims = {0: 10.0, 1: 10.0, 2: 10.0, 3: 10.0, 4: 1e6}
    out = combiner.combine(1, "m", models, REFERENCE, claims)["w"]
    equal = combiner.combine(1, "m", models, REFERENCE, dict.fromkeys(models, 10.0))["w"]
    np.testing.assert_allclose(out, equal, rtol=1e-6)


def test_the_rule_works_on_updates_around_the_reference() -> None:
    models = {c: {"w": m["w"]} for c, m in _models(7).items()}
    shift = {"w": np.full((3, 4), 5.0, np.float32)}
    shifted = {c: {"w": m["w"] + shift["w"]} for c, m in models.items()}
    combiner = _combiner(**{"robust.rule": "centered-clip", "robust.tau": 0.5})
    near = combiner.combine(1, "m", models, {"w": REFERENCE["w"]})["w"]
    far = combiner.combine(1, "m", shifted, shift)["w"]
    np.testing.assert_allclose(far - 5.0, near, atol=1e-5)
    x = np.stack([m["w"].ravel().astype(np.float64) for m in models.values()])
    np.testing.assert_allclose(near.ravel(), rules.centered_clip(x, 0.5, 3), atol=1e-6)


def test_too_few_replies_for_the_rule_stop_with_the_reason() -> None:
    combiner = _combiner(**{"robust.rule": "krum", "robust.f": 2})
    assert combiner.min_replies() == 7
    with pytest.raises(TooFewReplies, match=r"6 valid replies.*krum.*robust.f=2.*at least 7"):
        combiner.combine(3, "model", _models(6), REFERENCE)
    bucketed = _combiner(**{"robust.rule": "median", "robust.f": 1, "robust.bucket": 2})
    assert bucketed.min_replies() == 5  # ceil(5 / 2) = 3 buckets = 2f + 1


def test_simulated_attackers_replace_their_rows_and_are_counted() -> None:
    models = _models(6)
    combiner = _combiner(**{"attack.clients": "4,5", "attack.kind": "sign-flip",
                            "attack.scale": 10.0})  # fmt: skip
    out = combiner.combine(2, "m", models, REFERENCE)["w"].astype(np.float64)
    honest = sum(models[c]["w"].astype(np.float64) for c in range(4))
    flipped = -10.0 * (models[4]["w"].astype(np.float64) + models[5]["w"].astype(np.float64))
    np.testing.assert_allclose(out, (honest + flipped) / 6, rtol=1e-5)
    assert combiner.metrics() == {"attackers": 2.0}
    assert combiner.metrics() == {}  # read once per round
    replies = combiner.attack_replies(2, "m", models, dict.fromkeys(models, REFERENCE))
    for c in range(4):
        np.testing.assert_array_equal(replies[c]["w"], models[c]["w"])
    np.testing.assert_allclose(replies[5]["w"], -10.0 * models[5]["w"], rtol=1e-6)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"robust.rule": "krum", "robust.f": 2, "num-clients": 6}, "at least 7 updates"),
        (
            {
                "robust.rule": "trimmed-mean",
                "robust.f": 2,
                "num-clients": 10,
                "fraction-train": 0.4,
            },
            "a round has 4 clients",
        ),
        ({"robust.rule": "median", "algorithm": "d-fedem"}, "d-fedem takes mean, centered-clip"),
        ({"robust.rule": "median", "algorithm": "local"}, "local training combines nothing"),
        ({"robust.clip": 1.0, "algorithm": "noop"}, "no-op combines nothing"),
        ({"attack.clients": "12"}, "are not training clients"),
        ({"attack.clients": "2-1"}, "not a valid range"),
        ({"attack.clients": "x"}, "is not a client id"),
        (
            {"attack.clients": "1", "attack.kind": "label-flip", "algorithm": "fedsc"},
            "trains without labels",
        ),
    ],
)
def test_settings_a_round_cannot_honour_are_refused_in_one_line(
    settings: dict[str, Any], message: str
) -> None:
    with pytest.raises(SettingsError, match=message):
        resolve({"num-clients": 12, **settings})


# ---- learning under attack, in process ----------------------------------------------------


def _final_accuracy(tmp: Path, cache: Path, settings: dict[str, Any], name: str) -> float:
    summary = run_in_process(tmp, cache, name, settings)
    if settings.get("attack.clients"):  # a run under attack says so
        assert summary["attack"] == {"clients": [8, 9], "kind": "sign-flip", "simulated": True}
        assert summary["last-round"]["train"]["attackers"] == 2.0
    return float(summary["final"]["eval"]["test-accuracy"])


ATTACKED = {"num-clients": 10, "attack.clients": "8,9", "attack.kind": "sign-flip"}


@pytest.mark.slow
@pytest.mark.parametrize(
    ("algorithm", "robust"),
    [
        ("fedavg", {"robust.rule": "median", "robust.f": 2}),
        ("fedprox", {"robust.rule": "trimmed-mean", "robust.f": 2}),
        ("fedavg-plus", {"robust.rule": "geomed", "robust.f": 2}),
        ("fedem", {"robust.rule": "multi-krum", "robust.f": 2}),
        ("scaffold", {"robust.rule": "trimmed-mean", "robust.f": 2, "robust.nnm": True}),
        ("clustered", {"robust.rule": "geomed", "robust.f": 2}),
        ("d-fedem", {"robust.rule": "centered-clip", "robust.f": 2}),
    ],
)
def test_two_of_ten_attackers_cost_a_robust_run_at_most_3_points(
    tmp_path: Path, shared_cache: Path, algorithm: str, robust: dict[str, Any]
) -> None:
    """8 honest clients alone, then the same 8 with 2 sign-flipping attackers (each holding a
    copy of an honest partition): the mean is wrecked, the robust rule stays within 3 points."""
    base = {"algorithm": algorithm}
    clean = _final_accuracy(tmp_path, shared_cache, {**base, "num-clients": 8}, "clean")
    mean = _final_accuracy(tmp_path, shared_cache, {**base, **ATTACKED}, "mean")
    held = _final_accuracy(tmp_path, shared_cache, {**base, **ATTACKED, **robust}, "robust")
    assert clean > 0.6, clean
    assert mean < clean - 0.15, (mean, clean)
    assert held > clean - 0.03, (held, clean)
