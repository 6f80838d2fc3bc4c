"""pollen.flower: Pollen's algorithms as Flower strategies and client halves, run in process over
a LocalGrid (the real ServerApp/ClientApp objects, no transport)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import Strategy as FlowerStrategy
from torch import nn

from client.app import app as pollen_client_app
from pollen.core.registry import ALGORITHMS, ROBUST_RULES
from pollen.core.runconfig import all_settings, resolve
from pollen.core.rundir import Summary, read_summary
from pollen.flower import (
    STRATEGIES,
    ClientData,
    FedAvg,
    FedEM,
    FeDLRT,
    FedSC,
    PollenStrategy,
    SettingsError,
    client_data,
    components,
    keyword_settings,
    register,
)
from server.app import app as pollen_server_app
from server.engine import PhaseFailed
from server.local_grid import LocalGrid
from strategies.base import InitialArraysError
from tests.fakes import FakeGrid

FAST: dict[str, Any] = {
    "dataset": "digits", "lr": 0.1, "batch_size": 16, "seed": 1, "poll_interval": 0.05
}  # fmt: skip


def _kebab(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {k if "." in k else k.replace("_", "-"): v for k, v in kwargs.items()}


def _client_app(algorithm: str, **kwargs: Any) -> ClientApp:
    app = ClientApp()
    register(app, algorithm, **kwargs)
    return app


# ---- construction --------------------------------------------------------------------------
def test_every_registered_algorithm_is_a_flower_strategy_with_defaults() -> None:
    assert set(STRATEGIES) == set(ALGORITHMS)
    declared = all_settings()
    for name, cls in STRATEGIES.items():
        strategy = cls()  # every setting defaulted
        assert isinstance(strategy, FlowerStrategy)
        assert strategy.settings()["algorithm"] == name
        names = keyword_settings(name)
        assert set(names.values()) <= set(declared)
        assert "num_rounds" not in names and "algorithm" not in names
        for own in ALGORITHMS[name].settings:  # the algorithm's own settings are all there
            assert own.key in names.values()


def test_keyword_arguments_are_settings_checked_when_the_strategy_is_made() -> None:
    strategy = FedEM(components=2, local_epochs=3, robust_rule="median", robust_f=1)
    settings = strategy.settings()
    assert settings["fedem.components"] == 2
    assert settings["local-epochs"] == 3
    assert settings["robust.rule"] == "median"
    with pytest.raises(SettingsError, match=r"no setting 'component'.*did you mean components"):
        FedEM(component=2)
    with pytest.raises(SettingsError, match=r"fedem\.components.*expected int"):
        FedEM(components="three")
    with pytest.raises(SettingsError, match=r"robust\.rule"):
        FedEM(robust_rule="nonsense")


def test_own_models_only_where_the_clients_train_a_classifier() -> None:
    with pytest.raises(SettingsError, match="fedsc builds its models"):
        FedSC(model_fn=lambda: nn.Linear(2, 2))
    with pytest.raises(SettingsError, match="register it without model_fn"):
        register(ClientApp(), "adept-ae", model_fn=lambda: nn.Linear(2, 2))
    with pytest.raises(SettingsError, match="evaluate_fn"):
        FedAvg(model_fn=lambda: nn.Linear(2, 2), server_eval=True)


# ---- the same results as Pollen's own apps ------------------------------------------------
def _summary(out: Path) -> Summary:
    summary = read_summary(out)
    assert summary is not None, out
    return summary


def _pollen_run(out: Path, cache: Path, settings: dict[str, Any], clients: int) -> dict[str, Any]:
    config = dict(resolve({**_kebab(settings), "cache-dir": str(cache), "out-dir": str(out)}))
    grid = LocalGrid(pollen_client_app, clients, config)
    pollen_server_app(grid, Context(1, 0, {}, RecordDict(), config))
    return _summary(out).to_json()


@pytest.mark.slow
def test_fedem_start_gives_pollens_results_bitwise(tmp_path: Path, shared_cache: Path) -> None:
    settings = {**FAST, "algorithm": "fedem", "num_clients": 4,
                "num_rounds": 2, "server_eval": False, "fraction_train": 0.5}  # fmt: skip
    own = _pollen_run(tmp_path / "pollen", shared_cache, {**settings, "fedem.components": 2}, 4)
    strategy = FedEM(
        components=2, fraction_train=0.5, cache_dir=str(shared_cache),
        out_dir=str(tmp_path / "flower"), **FAST,
    )  # fmt: skip
    grid = LocalGrid(_client_app("fedem"), 4, {})
    result = strategy.start(grid=grid, initial_arrays=None, num_rounds=2)
    flower = _summary(tmp_path / "flower").to_json()
    assert own["final"]["eval"] == flower["final"]["eval"]
    assert own["last-round"]["train"] == flower["last-round"]["train"]
    assert dict(result.evaluate_metrics_clientapp[2]) == own["final"]["eval"]
    assert dict(result.train_metrics_clientapp[2]) == pytest.approx(own["last-round"]["train"])
    model = np.load(tmp_path / "pollen" / "final_model.npz")
    arrays = {k: v.numpy() for k, v in result.arrays.items()}
    assert sorted(arrays) == sorted(model.files)
    for key in model.files:
        assert np.array_equal(arrays[key], model[key]), key


@pytest.mark.slow
def test_flowers_own_loop_over_the_hooks_trains_the_same_model(
    tmp_path: Path, shared_cache: Path
) -> None:
    """Flower's Strategy.start (configure/aggregate each round) and Pollen's start sample the
    same clients and reach the same global model: the hooks are the algorithm's round."""
    kwargs: dict[str, Any] = {**FAST, "fraction_train": 0.6, "cache_dir": str(shared_cache)}
    engine = FedAvg(out_dir=str(tmp_path / "a"), **kwargs)
    ours = engine.start(grid=LocalGrid(_client_app("fedavg"), 5, {}), num_rounds=2)
    hooks = FedAvg(num_clients=5, out_dir=str(tmp_path / "b"), **kwargs)
    start = hooks.initial_arrays()
    theirs = FlowerStrategy.start(
        hooks, grid=LocalGrid(_client_app("fedavg"), 5, {}), initial_arrays=start, num_rounds=2
    )
    for key, value in ours.arrays.items():
        assert np.array_equal(value.numpy(), theirs.arrays[key].numpy()), key
    assert set(theirs.train_metrics_clientapp) == {1, 2}
    assert float(theirs.evaluate_metrics_clientapp[2]["test-accuracy"]) > 0.5  # type: ignore[arg-type]
    assert dict(theirs.train_metrics_clientapp[2]) == pytest.approx(
        dict(ours.train_metrics_clientapp[2])
    )


def test_multi_phase_algorithms_say_start_is_their_entry_point(shared_cache: Path) -> None:
    strategy = FeDLRT(num_clients=2, cache_dir=str(shared_cache), **FAST)
    grid = LocalGrid(_client_app("fedlrt"), 2, {})
    with pytest.raises(NotImplementedError, match="use start"):
        strategy.configure_train(1, ArrayRecord(), ConfigRecord(), grid)


# ---- a Flower user's own model and data ----------------------------------------------------
class TinyNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.head = nn.Linear(4 * 6 * 6, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.conv(x)).flatten(1))


def digits_share(partition_id: int, num_partitions: int) -> ClientData:
    from sklearn.datasets import load_digits

    bunch: Any = load_digits()
    x = (np.asarray(bunch.images)[:, None] / 16.0).astype(np.float32)  # 8x8, 1 channel
    y = np.asarray(bunch.target)
    share = np.array_split(np.random.default_rng(0).permutation(len(y)), num_partitions)
    idx = share[partition_id]
    cut = int(0.8 * len(idx))
    return client_data(train=(x[idx[:cut]], y[idx[:cut]]), test=(x[idx[cut:]], y[idx[cut:]]),
                       num_classes=10)  # fmt: skip


@pytest.mark.slow
def test_fedem_trains_a_users_own_model_on_their_own_data(tmp_path: Path) -> None:
    seen: list[tuple[int, MetricRecord | None]] = []

    def evaluate(rnd: int, arrays: ArrayRecord) -> MetricRecord | None:
        TinyNet().load_state_dict(arrays.to_torch_state_dict())  # one component at a time
        seen.append((rnd, None))
        return MetricRecord({"round": float(rnd)})

    strategy = FedEM(model_fn=TinyNet, components=2, lr=0.2, momentum=0.9, batch_size=16,
                     out_dir=str(tmp_path / "out"))  # fmt: skip
    user = TinyNet()
    app = _client_app("fedem", model_fn=TinyNet, data_fn=digits_share)
    result = strategy.start(
        grid=LocalGrid(app, 3, {}), initial_arrays=ArrayRecord(user.state_dict()),
        num_rounds=3, evaluate_fn=evaluate,
    )  # fmt: skip
    assert [r for r, _ in seen] == [0, 0, 1, 1, 2, 2, 3, 3]  # each component, each round
    assert dict(result.evaluate_metrics_serverapp[3]) == {"comp0.round": 3.0, "comp1.round": 3.0}
    parts = components(result.arrays)
    assert len(parts) == 2
    for part in parts:
        TinyNet().load_state_dict(part.to_torch_state_dict())
    final = result.evaluate_metrics_clientapp[3]
    assert final["clients"] == 3.0
    assert float(final["test-accuracy"]) > 0.5  # type: ignore[arg-type]  # chance is 0.1
    # the user's arrays started the first component (then trained); the others were drawn
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["status"] == "completed"
    with pytest.raises(InitialArraysError, match="do not fit the model"):
        FedEM(model_fn=TinyNet, out_dir=str(tmp_path / "bad")).start(
            grid=LocalGrid(app, 3, {}), initial_arrays=ArrayRecord(nn.Linear(3, 3).state_dict()),
            num_rounds=1,
        )  # fmt: skip


def digits_loaders(partition_id: int, num_partitions: int) -> ClientData:
    """The user's data as a Flower quickstart builds it: DataLoaders of {"img", "label"} dicts
    (a dataset with a transform applied per item)."""
    from torch.utils.data import DataLoader

    share = digits_share(partition_id, num_partitions)

    def loader(split: Any) -> DataLoader[Any]:
        items: Any = [{"img": torch.from_numpy(x) * 2 - 1, "label": int(y)}
                      for x, y in zip(split.x, split.y, strict=True)]  # fmt: skip
        return DataLoader(items, batch_size=32, shuffle=True)

    return client_data(loader(share.train), loader(share.test), num_classes=10)


def test_client_data_reads_dataloaders_as_flower_apps_build_them() -> None:
    from torch.utils.data import DataLoader, TensorDataset

    x = torch.rand(10, 1, 8, 8)
    y = torch.arange(10) % 3
    pairs = DataLoader(TensorDataset(x, y), batch_size=4)
    items: Any = [{"image": a, "labels": b} for a, b in zip(x, y, strict=True)]
    dicts = DataLoader(items, batch_size=3)
    data = client_data(pairs, dicts, num_classes=3, val=TensorDataset(x[:2], y[:2]))
    assert np.array_equal(data.train.x, x.numpy()) and np.array_equal(data.train.y, y.numpy())
    assert np.array_equal(data.test.x, x.numpy()) and np.array_equal(data.test.y, y.numpy())
    assert data.val.x.shape == (2, 1, 8, 8) and data.train.x.dtype == np.float32
    with pytest.raises(SettingsError, match=r"dicts with keys \['pixels', 'target'\]"):
        odd: Any = [{"pixels": x[0], "target": y[0]}]
        client_data(DataLoader(odd), pairs, num_classes=3)
    with pytest.raises(SettingsError, match="test is a int"):
        client_data(pairs, 5, num_classes=3)
    # a shuffling loader (the quickstart's training split) is read in its dataset's order:
    # the same examples in the same order in every process, so runs repeat
    shuffled = DataLoader(items, batch_size=3, shuffle=True)
    for _ in range(3):
        again = client_data(shuffled, pairs, num_classes=3)
        assert np.array_equal(again.train.x, x.numpy()) and np.array_equal(again.train.y, y)


def test_fedlrt_gives_evaluate_fn_and_result_the_users_dense_model(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """FeDLRT factorises the user's layers; what `evaluate_fn` and `Result.arrays` get is the
    user's model (each factorised weight as U diag(s) V^T), loadable with load_state_dict. The
    server's BLAS is capped while the run goes (server-blas-threads), each round is logged as
    Flower's strategies log it, and summary.json says the data was the app's own."""
    from threadpoolctl import threadpool_info

    seen: list[int] = []
    blas: list[int] = []

    def evaluate(rnd: int, arrays: ArrayRecord) -> MetricRecord:
        net = TinyNet()
        net.load_state_dict(arrays.to_torch_state_dict())
        seen.append(rnd)
        blas.extend(i["num_threads"] for i in threadpool_info()
                    if i["user_api"] == "blas" and "numpy" in i["filepath"])  # fmt: skip
        return MetricRecord({"norm": float(net.head.weight.detach().norm())})

    strategy = FeDLRT(model_fn=TinyNet, rank=4, layers="head", out_dir=str(tmp_path / "out"),
                      **FAST)  # fmt: skip
    app = _client_app("fedlrt", model_fn=TinyNet, data_fn=digits_loaders)
    start = TinyNet()
    with caplog.at_level("INFO", logger="flwr.pollen"):
        result = strategy.start(grid=LocalGrid(app, 2, {}), num_rounds=2, evaluate_fn=evaluate,
                                initial_arrays=ArrayRecord(start.state_dict()))  # fmt: skip
    assert seen == [0, 1, 2]
    assert set(blas) == {1}  # NumPy's BLAS (the server's SVDs), capped during the run
    final = TinyNet()
    final.load_state_dict(result.arrays.to_torch_state_dict())
    assert sorted(result.arrays) == sorted(TinyNet().state_dict())
    # the rank-4 start of the user's head layer, as evaluate_fn saw it at round 0
    w = start.head.weight.detach().numpy().astype(np.float64)
    u, sv, vt = np.linalg.svd(w, full_matrices=False)
    rank4 = float(np.linalg.norm((u[:, :4] * sv[:4]) @ vt[:4]))
    assert result.evaluate_metrics_serverapp[0]["norm"] == pytest.approx(rank4, rel=1e-5)
    assert "[ROUND 2/2]" in caplog.text and "Aggregated MetricRecord" in caplog.text
    assert "Global evaluation" in caplog.text and "Strategy execution finished" in caplog.text
    assert _summary(tmp_path / "out").dataset == "data_fn"


def test_a_data_function_must_return_the_clients_splits(tmp_path: Path) -> None:
    """A SuperNode sends its ClientApp's exception as an error reply: the run stops once every
    node has answered its hellos so, in one line naming the reason."""
    grid = FakeGrid(_client_app("fedavg", data_fn=lambda p, n: (p, n)), 2, {})
    grid.errors_as_replies = True
    with pytest.raises(PhaseFailed, match="returned tuple, not the client's splits"):
        FedAvg(num_clients=2, poll_interval=0.05, out_dir=str(tmp_path)).start(grid=grid)


def test_train_config_names_settings_of_the_run(tmp_path: Path) -> None:
    """Flower's quickstart passes `train_config=ConfigRecord({"lr": ...})`: its keys are the
    run's settings; a key that names none is refused in one line, before anything is sent."""
    grid = LocalGrid(_client_app("fedavg"), 2, {})
    FedAvg(out_dir=str(tmp_path / "ok"), **FAST).start(
        grid=grid, num_rounds=1, train_config=ConfigRecord({"lr": 0.05, "local-epochs": 2})
    )
    config = json.loads((tmp_path / "ok" / "config.json").read_text())
    assert (config["lr"], config["local-epochs"]) == (0.05, 2)
    with pytest.raises(SettingsError, match="'learning-rate' is no setting of fedavg"):
        FedAvg(out_dir=str(tmp_path / "bad")).start(
            grid=grid, train_config=ConfigRecord({"learning-rate": 0.1})
        )
    assert not (tmp_path / "bad").exists()


def test_a_run_config_gives_the_settings_it_names(caplog: pytest.LogCaptureFixture) -> None:
    run_config = {"num-server-rounds": 3, "lr": 0.01, "local-epochs": 2, "components": 2,
                  "batch-size": 32, "fraction-evaluate": 0.5}  # fmt: skip
    with caplog.at_level("INFO", logger="flwr.pollen"):
        strategy = FedEM.from_run_config(run_config, model_fn=TinyNet, lr=0.02)
    settings = strategy.settings()
    assert (settings["lr"], settings["local-epochs"], settings["fedem.components"]) == (
        0.02, 2, 2
    )  # fmt: skip
    assert settings["batch-size"] == 32
    assert "'num-server-rounds': no setting of fedem" in caplog.text
    assert "'fraction-evaluate': no setting of fedem" in caplog.text


def test_a_robust_rule_is_sized_by_the_nodes_the_grid_has(tmp_path: Path) -> None:
    """Krum with f = 1 needs 2f + 3 = 5 updates a round: the strategy is made without knowing
    how many SuperNodes there will be, and start counts the grid's."""
    strategy = FedAvg(robust_rule="krum", robust_f=1, out_dir=str(tmp_path / "five"), **FAST)
    result = strategy.start(grid=LocalGrid(_client_app("fedavg"), 5, {}), num_rounds=1)
    assert result.train_metrics_clientapp[1]["clients"] == 5.0
    strategy = FedAvg(robust_rule="krum", robust_f=1, out_dir=str(tmp_path / "three"), **FAST)
    with pytest.raises(SettingsError, match="but a round has 3 clients"):
        strategy.start(grid=LocalGrid(_client_app("fedavg"), 3, {}), num_rounds=1)
    with pytest.raises(SettingsError, match="but a round has 3 clients"):
        FedAvg(robust_rule="krum", robust_f=1, num_clients=3)  # the count given: checked now


# ---- every algorithm, from the registry -----------------------------------------------------
def _small(name: str) -> dict[str, Any]:
    """The registry's small settings of `name` as its strategy's keyword arguments."""
    names = {key: kw for kw, key in keyword_settings(name).items()}
    return {names[k]: v for k, v in ALGORITHMS[name].small.items() if k in names}


def _own(
    name: str, tmp_path: Path, clients: int, **extra: Any
) -> tuple[PollenStrategy, ClientApp]:
    """`name`'s strategy (keyword arguments `extra` besides) and client half with the user's
    data (digits, 8x8) and, where the algorithm takes one, the user's model."""
    cls = STRATEGIES[name]
    model: dict[str, Any] = {"model_fn": TinyNet} if cls.takes_model_fn else {}
    data: dict[str, Any] = {} if name in ("noop", "adept-pca") else {"data_fn": digits_share}
    small = _small(name)
    if name != "adept-pca":  # ADEPT-PCA's small run is its synthetic subspace data
        small.update(dataset="digits")
    kwargs: dict[str, Any] = {"batch_size": 16, "lr": 0.1, **small, **extra}
    strategy = cls(out_dir=str(tmp_path / name), num_clients=clients, **model, **kwargs)
    app = ClientApp()
    register(app, name, **model, **data)
    return strategy, app


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_algorithm_runs_with_the_users_data(name: str, tmp_path: Path) -> None:
    strategy, app = _own(name, tmp_path, 3)
    result = strategy.start(grid=LocalGrid(app, 3, {}), num_rounds=1)
    assert _summary(tmp_path / name).status == "completed"
    assert set(result.train_metrics_clientapp) == {1}
    if ALGORITHMS[name].labels and name != "noop":
        assert "test-accuracy" in result.train_metrics_clientapp[1], name


ONE_EXCHANGE = sorted(
    n for n, s in ALGORITHMS.items() if len(s.round_phases()) == 1 and not s.once
)


@pytest.mark.slow
@pytest.mark.parametrize("name", ONE_EXCHANGE)
def test_flowers_loop_runs_every_one_exchange_algorithm(name: str, tmp_path: Path) -> None:
    strategy, app = _own(name, tmp_path, 3)
    result = FlowerStrategy.start(strategy, grid=LocalGrid(app, 3, {}),
                                  initial_arrays=ArrayRecord(), num_rounds=2)  # fmt: skip
    assert set(result.train_metrics_clientapp) == {1, 2}
    assert set(result.evaluate_metrics_clientapp) == {1, 2}


def test_a_client_half_refuses_another_algorithms_instructions(tmp_path: Path) -> None:
    grid = FakeGrid(_client_app("fedem", data_fn=digits_share), 1, {})
    grid.errors_as_replies = True
    with pytest.raises(PhaseFailed, match="runs fedem's client half, the server fedavg"):
        FedAvg(num_clients=1, poll_interval=0.05, out_dir=str(tmp_path)).start(grid=grid)


@pytest.mark.slow
def test_a_stopped_run_resumes_in_its_out_dir(tmp_path: Path, shared_cache: Path) -> None:
    kwargs: dict[str, Any] = {**FAST, "cache_dir": str(shared_cache), "num_clients": 3}
    once = FedAvg(out_dir=str(tmp_path / "a"), **kwargs)
    once.start(grid=LocalGrid(_client_app("fedavg"), 3, {}), num_rounds=1)
    resumed = FedAvg(out_dir=str(tmp_path / "a"), resume=True, **kwargs)
    result = resumed.start(grid=LocalGrid(_client_app("fedavg"), 3, {}), num_rounds=2)
    fresh = FedAvg(out_dir=str(tmp_path / "b"), **kwargs)
    whole = fresh.start(grid=LocalGrid(_client_app("fedavg"), 3, {}), num_rounds=2)
    assert set(result.train_metrics_clientapp) == {2}  # this call's rounds
    for key, value in whole.arrays.items():
        assert np.array_equal(value.numpy(), result.arrays[key].numpy()), key


def test_every_strategy_takes_every_robust_rule_or_refuses_it_in_one_line() -> None:
    """The rules the registry lets an algorithm take are taken when the strategy is made; the
    others are refused there, in one line naming the rule and the algorithm's reason."""
    for name, cls in STRATEGIES.items():
        for rule in ROBUST_RULES:
            kwargs: dict[str, Any] = {"num_clients": 8, "robust_rule": rule, "robust_f": 1}
            if rule in ALGORITHMS[name].robust_rules:
                assert cls(**kwargs).settings()["robust.rule"] == rule
                continue
            with pytest.raises(SettingsError) as refused:
                cls(**kwargs)
            assert "\n" not in str(refused.value) and rule in str(refused.value), (name, rule)


# ---- secure aggregation in a user's own app --------------------------------------------------
SECURE = sorted(n for n, s in ALGORITHMS.items() if s.secagg)


@pytest.mark.slow
@pytest.mark.parametrize("name", SECURE)
def test_every_secure_algorithm_runs_securely_with_the_users_data(
    name: str, tmp_path: Path
) -> None:
    """`secagg_enabled=True` on the strategy: its client half, registered on the user's
    ClientApp, answers the protocol's stages too, and the server sees only sums."""
    strategy, app = _own(name, tmp_path, 3, secagg_enabled=True)
    result = strategy.start(grid=LocalGrid(app, 3, {}), num_rounds=1)
    summary = _summary(tmp_path / name)
    assert summary.status == "completed"
    assert summary.secure_aggregation is not None
    assert set(result.train_metrics_clientapp) == {1}
    phases = [p.phase for p in summary.last_round.phases] if summary.last_round else []
    assert "query.secagg_unmask" in phases


def test_flowers_own_loop_refuses_secure_aggregation_in_one_line(tmp_path: Path) -> None:
    strategy, app = _own("fedavg", tmp_path, 3, secagg_enabled=True)
    with pytest.raises(NotImplementedError, match=r"four exchanges for each sum.*use start"):
        FlowerStrategy.start(strategy, grid=LocalGrid(app, 3, {}),
                             initial_arrays=ArrayRecord(), num_rounds=1)  # fmt: skip


@pytest.mark.slow
def test_a_flower_apps_strategy_paces_its_rounds(tmp_path: Path) -> None:
    """Deadline rounds with over-selection and FedBuff in a user's own app (docs/pacing.md):
    the keywords are the settings; the user's clients' devices on the virtual clock."""
    devices = {"heterogeneity_profile": "tiers", "heterogeneity_clock": "virtual",
               "heterogeneity_slow_fraction": 0.25}  # fmt: skip
    paced, app = _own("fedavg", tmp_path / "paced", 4, fraction_train=0.5,
                      round_over_selection=1.0, round_deadline=30.0, **devices)  # fmt: skip
    paced.start(grid=LocalGrid(app, 4, {}), num_rounds=2)
    rows = [json.loads(x) for x in (tmp_path / "paced" / "fedavg" / "metrics.jsonl").open()]
    for row in rows:
        (train,) = row["phases"]
        assert train["sent"] == 4 and train["valid"] == 2 and len(train["late"]) == 2
    buffered, app = _own("fedem", tmp_path / "fedbuff", 4, async_buffer=2, async_concurrency=3)
    buffered.start(grid=LocalGrid(app, 4, {}), num_rounds=2)
    assert _summary(tmp_path / "fedbuff" / "fedem").status == "completed"
    with pytest.raises(SettingsError, match="fedlrt refuses buffered asynchronous aggregation"):
        FeDLRT(async_buffer=2)
