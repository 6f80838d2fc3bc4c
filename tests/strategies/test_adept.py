"""ADEPT on the engine, in-process: PCA and AE rounds, baselines, personal state, sigma
averaging, and malformed replies rejected while the run continues."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, RecordDict

from client.app import app as client_app
from client.state import StateStore
from pollen.core import protocol
from pollen.core.registry import get_algorithm
from pollen.core.rundir import read_jsonl
from server.engine import Engine
from server.results import ResultsWriter
from strategies.adept import ADEPT, ADEPTPCA
from strategies.base import strategy_class
from tests.fakes import FakeClock, FakeGrid, settings_of


def _run(cfg: dict[str, Any], nodes: int) -> tuple[ADEPT, FakeGrid]:
    strategy = strategy_class(get_algorithm(cfg["algorithm"]))(cfg)
    assert isinstance(strategy, ADEPT)
    grid = FakeGrid(client_app, nodes, cfg)
    clock = FakeClock()
    Engine(grid, cfg, strategy, ResultsWriter(cfg["out-dir"]), clock=clock, sleep=clock.sleep).run()
    return strategy, grid


def _pca(run_config: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return settings_of({
        **run_config, "algorithm": "adept-pca", "dataset": "pca-synthetic",
        "partitioner": "natural", "val-fraction": 0.0, "num-clients": 4, "num-rounds": 6,
        "synthetic.dimension": 12, "synthetic.rank": 3, "synthetic.noise": 0.2,
        "synthetic.heterogeneity": 0.1, "synthetic.train-size": 10, "synthetic.test-size": 50,
        "adept-pca.rank": 3, "adept-pca.noise": 0.2, "lr": 2e-3, "adept.lr-global": 0.5,
        "adept.lr-sigma": 1e-6, "adept.sigma-init": 0.1, "server-eval": False, **extra,
    })  # fmt: skip


def _final(cfg: dict[str, Any]) -> dict[str, float]:
    final: dict[str, float] = json.loads((Path(cfg["out-dir"]) / "summary.json").read_text())[
        "final"
    ]["eval"]
    return final


def test_adept_pca_round_keeps_v_on_the_manifold_and_u_on_the_client(
    run_config: dict[str, Any],
) -> None:
    cfg = _pca(run_config)
    strategy, _ = _run(cfg, 4)
    v = strategy.mu["V"]
    assert v.shape == (12, 3) and v.dtype == np.float64
    np.testing.assert_allclose(v.T @ v, np.eye(3), atol=1e-10)
    assert strategy.sigma["V"].shape == (1,) and float(strategy.sigma["V"][0]) != 0.1
    rows = read_jsonl(Path(cfg["out-dir"]) / "metrics.jsonl")
    assert rows[-1]["train"]["clients"] == 4.0 and "error-ratio-max" in rows[-1]["train"]
    assert rows[-1]["train"]["sigma-mean"] == pytest.approx(float(strategy.sigma["V"][0]))
    final = _final(cfg)
    assert 1.0 <= final["error-ratio"] <= final["error-ratio-max"]
    saved = StateStore(Path(cfg["out-dir"]) / "client-state" / "test" / "client-0").load(99)
    assert saved is not None and saved[1]["round"] == 6
    u = saved[0]["U"]
    np.testing.assert_allclose(u.T @ u, np.eye(3), atol=1e-10)


def test_adept_pca_flattens_images(run_config: dict[str, Any]) -> None:
    """On image data PCA works on the flattened pixels (d = 64 for the 8x8 digits)."""
    cfg = settings_of({
        **run_config, "algorithm": "adept-pca", "dataset": "digits", "num-rounds": 2,
        "adept-pca.rank": 4, "lr": 1e-3, "server-eval": False,
    })  # fmt: skip
    strategy, _ = _run(cfg, 3)
    v = strategy.global_arrays()["V"]  # type: ignore[index]
    assert v.shape == (64, 4)
    np.testing.assert_allclose(v.T @ v, np.eye(4), atol=1e-8)
    assert np.isfinite(_final(cfg)["test-error"])


@pytest.mark.slow
def test_pca_global_baseline_finds_the_pooled_subspace(run_config: dict[str, Any]) -> None:
    from federated_data.synthetic_pca import generate_pca_synthetic
    from models.stiefel import top_eigenvectors

    cfg = _pca(run_config, **{"adept.method": "fedavg", "num-rounds": 60, "lr": 4e-3})
    strategy, _ = _run(cfg, 4)
    clients, _, _ = generate_pca_synthetic({"dimension": 12, "rank": 3, "noise": 0.2,
        "heterogeneity": 0.1, "train_size": 10, "test_size": 50, "num_clients": 4,
        "seed": cfg["synthetic.seed"]})  # fmt: skip
    pooled = top_eigenvectors(np.mean([x.T.astype(float) @ x / 10 for x, _ in clients], 0), 3)
    v = strategy.mu["V"]
    assert np.linalg.norm(v @ v.T - pooled @ pooled.T) < 1e-3
    assert float(strategy.sigma["V"][0]) == 0.1  # fedavg leaves sigma alone


def _corrupt(kind: str):  # type: ignore[no-untyped-def]
    def fault(node: int, msg: Message, _: RecordDict | None) -> Any:
        if node != 100 or msg.metadata.message_type != "train":
            return None

        def change(content: RecordDict) -> RecordDict:
            mu, sigma = protocol.arrays_of(content, "mu"), protocol.arrays_of(content, "sigma")
            if kind == "shape":
                mu["V"] = mu["V"][:, :2].copy()
            elif kind == "nan":
                sigma["V"] = np.array([np.nan])
            else:
                sigma["V"] = np.array([-0.5])
            content["mu"], content["sigma"] = protocol.to_record(mu), protocol.to_record(sigma)
            return content

        return change

    return fault


@pytest.mark.parametrize("kind", ["shape", "nan", "negative"])
def test_malformed_reply_is_rejected_and_the_run_continues(
    run_config: dict[str, Any], kind: str
) -> None:
    cfg = _pca(run_config, **{"num-rounds": 2, "final-eval": False, "out-dir":
                              f"{run_config['out-dir']}-{kind}", "run-name": kind})  # fmt: skip
    strategy = ADEPTPCA(cfg)
    grid = FakeGrid(client_app, 4, cfg)
    grid.faults.append(_corrupt(kind))
    clock = FakeClock()
    Engine(grid, cfg, strategy, ResultsWriter(cfg["out-dir"]), clock=clock, sleep=clock.sleep).run()
    rows = read_jsonl(Path(cfg["out-dir"]) / "metrics.jsonl")
    assert [r["train"]["clients"] for r in rows] == [3.0, 3.0]
    assert float(strategy.sigma["V"][0]) > 0 and np.isfinite(strategy.mu["V"]).all()


def _ae(run_config: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return settings_of({
        **run_config, "algorithm": "adept-ae", "partitioner": "classes", "classes-per-client": 1,
        "num-clients": 3, "num-rounds": 3, "adept-ae.latent": 4, "adept-ae.local-steps": 5,
        "lr": 0.01, "momentum": 0.9, "persist-momentum": True, "adept.sigma-init": 1.0,
        "adept-ae.lazy-rounds": 1, "server-eval": False, **extra,
    })  # fmt: skip


def test_adept_ae_averages_mu_and_per_weight_sigma(run_config: dict[str, Any]) -> None:
    cfg = _ae(run_config)
    strategy, _ = _run(cfg, 3)
    assert set(strategy.sigma) == set(strategy.mu)
    for key, value in strategy.mu.items():
        assert strategy.sigma[key].shape == value.shape and value.dtype == np.float32
    assert not np.allclose(strategy.sigma["decoder.weight"], 1.0)  # sigma moved after round 1
    root = Path(cfg["out-dir"]) / "client-state" / "test"
    sigmas = []
    for cid in range(3):
        saved = StateStore(root / f"client-{cid}").load(99)
        assert saved is not None and saved[1]["role"] == "adept"
        assert any(k.startswith("momentum.") for k in saved[0])
        sigmas.append(saved[0]["sigma.decoder.weight"])
    # the server's sigma is the plain mean of the clients' last sigma_i
    np.testing.assert_allclose(strategy.sigma["decoder.weight"], np.mean(sigmas, 0), rtol=1e-6)
    final = _final(cfg)
    assert 0 < final["test-energy"] < 1 and final["test-energy-min"] <= final["test-energy"]


@pytest.mark.parametrize("method", ["local", "fedavg", "fedavg-ft"])
def test_ae_baselines_run_and_evaluate(run_config: dict[str, Any], method: str) -> None:
    cfg = _ae(run_config, **{"adept.method": method, "num-rounds": 4, "out-dir":
                             f"{run_config['out-dir']}-{method}", "run-name": method})  # fmt: skip
    strategy, _ = _run(cfg, 3)
    rows = read_jsonl(Path(cfg["out-dir"]) / "metrics.jsonl")
    assert all(r["train"]["clients"] == 3.0 for r in rows)
    assert "test-error" in _final(cfg)
    init = ADEPT(cfg)
    init.initialize(cfg["seed"])
    moved = not np.allclose(strategy.mu["decoder.weight"], init.mu["decoder.weight"])
    assert moved == (method != "local")
    if method == "fedavg-ft":  # FedAvg for 2 rounds, then frozen global, local tuning
        saved = StateStore(Path(cfg["out-dir"]) / "client-state" / method / "client-0").load(99)
        assert saved is not None and saved[1]["role"] == "fedavg-ft"


def test_strategy_state_round_trips(run_config: dict[str, Any]) -> None:
    cfg = _ae(run_config)
    strategy = ADEPT(cfg)
    strategy.initialize(3)
    strategy.sigma["encoder.bias"] = strategy.sigma["encoder.bias"] * 0.5
    arrays, meta = strategy.state()
    restored = ADEPT(cfg)
    restored.load_state(arrays, meta)
    assert set(restored.mu) == set(strategy.mu) and set(restored.sigma) == set(strategy.sigma)
    for key in strategy.mu:
        np.testing.assert_array_equal(restored.mu[key], strategy.mu[key])
        np.testing.assert_array_equal(restored.sigma[key], strategy.sigma[key])


def _dgm(run_config: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return settings_of({
        **run_config, "algorithm": "adept-dgm", "partitioner": "classes",
        "classes-per-client": 1, "num-clients": 3, "num-rounds": 3, "adept-dgm.channels": 4,
        "adept-dgm.kernel": 3, "adept-ae.local-steps": 4, "adept-ae.lazy-rounds": 1,
        "adept-dgm.samples": 12, "adept-dgm.sample-steps": 5, "adept-dgm.kid-subsets": 3,
        "adept-dgm.feature-epochs": 1, "lr": 1e-3, "adept.sigma-init": 0.8,
        "server-eval": False, **extra,
    })  # fmt: skip


def test_adept_dgm_trains_denoisers_averages_sigma_and_samples(
    run_config: dict[str, Any],
) -> None:
    cfg = _dgm(run_config)
    strategy, _ = _run(cfg, 3)
    assert set(strategy.sigma) == set(strategy.mu) and "down_layers.0.weight" in strategy.mu
    assert not np.allclose(strategy.sigma["up_layers.2.weight"], 0.8)
    root = Path(cfg["out-dir"]) / "client-state" / "test"
    sigmas = []
    for cid in range(3):
        saved = StateStore(root / f"client-{cid}").load(99)
        assert saved is not None and saved[1]["round"] == 3
        assert float(saved[0]["adam.0.step"]) == 12.0  # Adam's moments survive the rounds
        sigmas.append(saved[0]["sigma.up_layers.2.weight"])
    np.testing.assert_allclose(strategy.sigma["up_layers.2.weight"], np.mean(sigmas, 0), rtol=1e-6)
    final = _final(cfg)
    assert np.isfinite(final["sample-kid"]) and final["test-error"] > 0
    samples = Path(cfg["out-dir"]) / "samples"
    assert sorted(p.name for p in samples.glob("client-?.png")) == [
        "client-0.png",
        "client-1.png",
        "client-2.png",
    ]
    line = json.loads((samples / "client-1.json").read_text())
    assert line["role"] == "adept" and line["sample-examples"] == 12


@pytest.mark.parametrize("method", ["local", "fedavg-ft"])
def test_dgm_baselines_sample_from_their_own_models(
    run_config: dict[str, Any], method: str
) -> None:
    cfg = _dgm(run_config, **{"adept.method": method, "num-rounds": 2, "adept-dgm.diffusion":
                              "vp", "out-dir": f"{run_config['out-dir']}-{method}",
                              "run-name": method})  # fmt: skip
    _run(cfg, 3)
    line = json.loads((Path(cfg["out-dir"]) / "samples" / "client-0.json").read_text())
    assert line["role"] == method and np.isfinite(line["sample-kid"])


def test_late_drop_scales_both_learning_rates_from_three_quarters_of_the_rounds(
    run_config: dict[str, Any],
) -> None:
    """The server sends each round's eta1 and eta2 under lr-schedule=late-drop: x0.1 after
    round 3 of 4 (3 * 4 // 4), eta3 untouched (it is not sent)."""
    cfg = _ae(run_config, **{"num-rounds": 4, "lr-schedule": "late-drop", "adept.lr-global":
                             0.02, "final-eval": False})  # fmt: skip
    sent: dict[int, dict[str, Any]] = {}

    def record(node: int, msg: Message, _: RecordDict | None) -> None:
        if msg.metadata.message_type == "train" and node == 100:
            sent[protocol.round_of(msg.content)] = dict(protocol.config_of(msg.content))

    strategy = ADEPT(cfg)
    grid = FakeGrid(client_app, 3, cfg)
    grid.faults.append(record)
    clock = FakeClock()
    Engine(grid, cfg, strategy, ResultsWriter(cfg["out-dir"]), clock=clock, sleep=clock.sleep).run()
    assert [sent[r]["lr"] for r in range(1, 5)] == pytest.approx([0.01, 0.01, 0.01, 0.001])
    assert [sent[r]["lr-global"] for r in range(1, 5)] == pytest.approx([0.02] * 3 + [0.002])


def _dgm_adam(run_config: dict[str, Any], tag: str, **extra: Any) -> dict[str, Any]:
    return _dgm(run_config, **{"adept-dgm.mu-optimizer": "adam", "adept.lr-global": 0.01,
        "final-eval": False, "out-dir": f"{run_config['out-dir']}-{tag}", "run-name": tag,
        **extra})  # fmt: skip


def test_dgm_adam_on_mu_keeps_its_moments_in_the_client_state(run_config: dict[str, Any]) -> None:
    cfg = _dgm_adam(run_config, "adam")
    strategy, _ = _run(cfg, 3)
    root = Path(cfg["out-dir"]) / "client-state" / "adam"
    saved = StateStore(root / "client-0").load(99)
    assert saved is not None
    arrays = saved[0]
    tensors = len(strategy.mu)
    assert {f"mu-adam.{i}.step" for i in range(tensors)} <= set(arrays)
    # 3 rounds x 4 local steps, one Adam step of mu each: the count runs on across rounds
    assert [float(arrays[f"mu-adam.{i}.step"]) for i in range(tensors)] == [12.0] * tensors
    assert float(np.abs(arrays["mu-adam.0.exp_avg"]).max()) > 0
    default = _dgm(run_config, **{"final-eval": False, "out-dir": f"{run_config['out-dir']}-sgd",
                                  "run-name": "sgd"})  # fmt: skip
    _run(default, 3)
    plain = StateStore(Path(default["out-dir"]) / "client-state" / "sgd" / "client-0").load(99)
    assert plain is not None and not any(k.startswith("mu-adam.") for k in plain[0])


def test_dgm_client_steps_mu_at_the_rounds_global_rate(run_config: dict[str, Any]) -> None:
    """A client takes eta2 from its instruction: told lr-global = 0, its Adam leaves mu where
    it was; the untouched client moves it."""
    cfg = _dgm_adam(run_config, "rate", **{"num-rounds": 1})
    seen: dict[int, tuple[dict[str, np.ndarray], dict[str, np.ndarray]]] = {}

    def tamper(node: int, msg: Message, _: RecordDict | None) -> Any:
        if msg.metadata.message_type != "train":
            return None
        if node == 100:
            config = protocol.config_of(msg.content)
            msg.content[protocol.CONFIG] = ConfigRecord({**config, "lr-global": 0.0})
        sent = protocol.arrays_of(msg.content, "mu")

        def keep(content: RecordDict) -> RecordDict:
            seen[node] = (sent, protocol.arrays_of(content, "mu"))
            return content

        return keep

    strategy = strategy_class(get_algorithm("adept-dgm"))(cfg)
    grid = FakeGrid(client_app, 3, cfg)
    grid.faults.append(tamper)
    clock = FakeClock()
    Engine(grid, cfg, strategy, ResultsWriter(cfg["out-dir"]), clock=clock, sleep=clock.sleep).run()
    for key, value in seen[100][0].items():
        np.testing.assert_array_equal(seen[100][1][key], value)
    assert any(not np.array_equal(seen[101][1][k], v) for k, v in seen[101][0].items())


def test_dgm_adam_state_survives_a_restart(run_config: dict[str, Any]) -> None:
    """2 rounds, stop, resume for the third: the same mu as 3 rounds in one go, because the
    clients' Adam moments of mu come back from their state store; with those moments wiped
    before the resume, mu ends elsewhere."""
    from tests.server.test_bad_replies import TOL

    def run(tag: str, rounds: int, **extra: Any) -> ADEPT:
        cfg = _dgm_adam(run_config, tag, **{"num-rounds": rounds, **extra})
        strategy = strategy_class(get_algorithm("adept-dgm"))(cfg)
        assert isinstance(strategy, ADEPT)
        grid = FakeGrid(client_app, 3, cfg)
        clock = FakeClock()
        Engine(grid, cfg, strategy, ResultsWriter(cfg["out-dir"]), clock=clock,
               sleep=clock.sleep).run()  # fmt: skip
        return strategy

    whole = run("whole", 3)
    run("part", 2)
    wiped_dir = Path(f"{run_config['out-dir']}-wiped")
    shutil.copytree(f"{run_config['out-dir']}-part", wiped_dir)
    for cid in range(3):
        store = StateStore(wiped_dir / "client-state" / "part" / f"client-{cid}")
        saved = store.load(3)
        assert saved is not None and any(k.startswith("mu-adam.") for k in saved[0])
        kept = {k: v for k, v in saved[0].items() if not k.startswith("mu-adam.")}
        store.save(int(saved[1]["round"]), kept, saved[1])
    resumed = run("part", 3, resume=True)
    wiped = run("wiped", 3, resume=True, **{"run-name": "part"})
    gaps = []
    for key, value in whole.mu.items():
        np.testing.assert_allclose(resumed.mu[key], value, rtol=TOL, atol=TOL, err_msg=key)
        gaps.append(float(np.abs(wiped.mu[key] - value).max()))
    assert max(gaps) > 10 * TOL


def _ae_synthetic(run_config: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return settings_of({
        **run_config, "algorithm": "adept-ae", "dataset": "ae-synthetic",
        "partitioner": "natural", "val-fraction": 0.0, "num-clients": 3, "num-rounds": 2,
        "synthetic.dimension": 16, "synthetic.rank": 3, "synthetic.noise": 0.0,
        "synthetic.heterogeneity": 0.05, "synthetic.train-size": 10, "synthetic.test-size": 20,
        "adept-ae.latent": 3, "adept-ae.local-steps": 1, "adept.sigma-init": 0.4,
        "momentum": 0.9, "persist-momentum": True, "server-eval": False, **extra,
    })  # fmt: skip


def test_true_decoder_init_starts_each_client_at_its_generator(run_config: dict[str, Any]) -> None:
    """adept-ae.init-decoder=truth (Table 1's Baseline): with lr 0 the personal decoders stay
    where they started, at each client's own generator scaled like its training data."""
    from federated_data.synthetic_ae import training_decoders

    cfg = _ae_synthetic(run_config, **{"adept-ae.init-decoder": "truth", "lr": 0.0})
    _run(cfg, 3)
    params = {"num_clients": 3, "dimension": 16, "rank": 3, "noise": 0.0,
              "heterogeneity": 0.05, "train_size": 10, "test_size": 20,
              "seed": cfg["synthetic.seed"]}  # fmt: skip
    truth = training_decoders(params)
    root = Path(cfg["out-dir"]) / "client-state" / "test"
    for cid in range(3):
        saved = StateStore(root / f"client-{cid}").load(99)
        assert saved is not None
        np.testing.assert_allclose(saved[0]["theta.decoder.weight"], truth[cid][0], rtol=1e-6)
        np.testing.assert_allclose(saved[0]["theta.decoder.bias"], truth[cid][1], rtol=1e-6)
    assert not np.allclose(truth[0][0], truth[1][0])  # each client its own decoder


def test_adept_ae_learns_the_synthetic_decoders(run_config: dict[str, Any]) -> None:
    cfg = _ae_synthetic(run_config, **{"num-rounds": 30, "lr": 0.05})
    _run(cfg, 3)
    first = read_jsonl(Path(cfg["out-dir"]) / "metrics.jsonl")[0]["train"]["test-energy"]
    assert _final(cfg)["test-energy"] > max(first, 0.0) + 0.2


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"dataset": "digits"}, "only dataset 'ae-synthetic' has"),
        ({"dataset": "ae-synthetic", "adept-ae.latent": 4}, "must equal the generator's latent"),
    ],
)
def test_true_decoder_init_is_refused_where_there_is_no_true_decoder(
    extra: dict[str, Any], message: str
) -> None:
    from pollen.core.runconfig import resolve
    from pollen.core.settings import SettingsError

    base = {"algorithm": "adept-ae", "adept-ae.init-decoder": "truth", "synthetic.rank": 5,
            "adept-ae.latent": 5}  # fmt: skip
    with pytest.raises(SettingsError, match=message):
        resolve({**base, **extra})
