from __future__ import annotations

from pathlib import Path

import pytest
import tomllib

from pollen.core import registry, runconfig, settings
from pollen.core.runconfig import resolve
from pollen.core.settings import SettingsError
from pollen.tools.pyproject_sync import synced

ROOT = Path(__file__).resolve().parents[2]


def test_pyproject_declares_exactly_the_settings() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    assert synced(text) == text, (
        "run `python -m pollen.tools.pyproject_sync` to update pyproject.toml"
    )
    config = tomllib.loads(text)["tool"]["flwr"]["app"]["config"]

    def flat(d: dict, prefix: str = "") -> dict:
        out: dict = {}
        for k, v in d.items():
            out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
        return out

    assert flat(config) == runconfig.defaults()


def test_values_are_coerced_from_text() -> None:
    cfg = resolve({"num-rounds": "7", "lr": "0.5", "server-eval": "false", "fraction-train": 1})
    assert cfg["num-rounds"] == 7 and cfg["lr"] == 0.5 and cfg["server-eval"] is False
    assert cfg["fraction-train"] == 1.0 and isinstance(cfg["fraction-train"], float)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"num-rounds": "2.5"}, "num-rounds"),
        ({"num-rounds": 0}, "below the minimum"),
        ({"lr": "nan"}, "setting 'lr'"),
        ({"fraction-train": 1.5}, "above the maximum"),
        ({"model": "resnet"}, "not one of"),
        ({"server-eval": "maybe"}, "expected bool"),
        ({"algorithm": "nope"}, "unknown algorithm"),
        ({"rounds": 3}, "unknown setting 'rounds'"),
        ({"val-fraction": 0.5, "test-fraction": 0.5}, "val-fraction"),
        ({"min-replies": 9}, "exceeds num-clients"),
    ],
)
def test_bad_settings_are_named(overrides: dict, message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        resolve(overrides)


def test_assignments_parse() -> None:
    assert settings.parse_assignments(["a=1", " b = x=y "]) == {"a": "1", "b": "x=y"}
    with pytest.raises(SettingsError):
        settings.parse_assignments(["novalue"])


def test_model_choices_are_the_registered_models() -> None:
    from models.registry import ALL_MODEL_NAMES

    assert set(runconfig.all_settings()["model"].choices or ()) == set(ALL_MODEL_NAMES)


def test_model_round_places_a_clients_metric_at_the_model_it_describes() -> None:
    """Reports and TensorBoard place round r's client figures by the model they describe:
    evaluations of the received model at r-1 (FedAvg tests before training; FedSC's kNN
    accuracy; FedAvg+'s global-test-*), training figures at r, and Local's evaluations, which
    test the personal model after the round's training, at r."""
    from pollen.core.runconfig import model_round

    assert model_round("fedavg", "test-accuracy", 3) == 2
    assert model_round("fedavg", "test-accuracy-p10", 3) == 2
    assert model_round("fedsc", "knn-accuracy", 3) == 2
    assert model_round("fedavg-plus", "global-test-loss", 3) == 2
    assert model_round("fedavg", "train-loss", 3) == 3
    assert model_round("fedavg", "train-accuracy", 3) == 3
    assert model_round("local", "test-accuracy", 3) == 3
    assert model_round("an-algorithm-of-a-later-version", "test-accuracy", 3) == 2


def test_dp_sgd_is_for_the_algorithms_that_declare_it() -> None:
    expected = {name for name, spec in registry.ALGORITHMS.items() if spec.dp}
    # the shared supervised loop has it; the algorithms with loops of their own do not
    assert {"fedavg", "fedem", "scaffold"} <= expected
    assert not expected & {"fedlrt", "fedsc", "adept-pca"}
    for name in registry.ALGORITHMS:
        asked = {"algorithm": name, "dp.noise-multiplier": 1.0}
        if name in expected:
            assert runconfig.resolve(asked)["dp.noise-multiplier"] == 1.0
            assert runconfig.foreign_settings(name, ["dp.delta"]) == {}
            continue
        # `pollen settings` does not list dp.* for it, and the command line calls them foreign
        assert runconfig.foreign_settings(name, ["dp.delta"]) == {"dp.delta": sorted(expected)}
        with pytest.raises(SettingsError, match=f"{name} has no DP-SGD training"):
            runconfig.resolve(asked)
        runconfig.resolve({**asked, "dp.noise-multiplier": 0.0})  # off: nothing to refuse
    with pytest.raises(SettingsError, match="both set: give one"):
        runconfig.resolve({"dp.noise-multiplier": 1.0, "dp.target-epsilon": 3.0})
    with pytest.raises(SettingsError, match="amp=true with DP-SGD: refused"):
        runconfig.resolve({"dp.target-epsilon": 3.0, "amp": True})
    with pytest.raises(SettingsError, match="drop-last=true with DP-SGD: refused"):
        runconfig.resolve({"dp.noise-multiplier": 1.0, "drop-last": True})
    assert runconfig.resolve({"dp.noise-multiplier": 1.0, "random-flip": True})["random-flip"]


def test_typed_views_are_kept_by_contents_and_types() -> None:
    """SettingsGroup.of checks a run's settings once: equal contents give the same view, and a
    value of another type (True for 1) is checked again, not served from the kept view."""
    cfg = resolve({"num-clients": 4})
    view = settings.RunSettings.of(cfg)
    assert settings.RunSettings.of(dict(cfg)) is view
    assert settings.RunSettings.of({**cfg, "num-clients": 5}).num_clients == 5
    with pytest.raises(SettingsError, match="num-clients"):
        settings.RunSettings.of({**cfg, "num-clients": True})
    assert settings.RunSettings.of({**cfg, "lr": 1}).lr == 1.0
    assert settings.settings_key({"x": [1]}) is None  # type: ignore[dict-item]


def test_a_running_apps_settings_are_resolved_once_and_never_change() -> None:
    import copy
    import pickle

    run_config = {"num-clients": 4, "lr": 0.5}
    cfg = runconfig.from_run_config(run_config)
    assert isinstance(cfg, settings.FrozenSettings)
    assert runconfig.from_run_config(dict(run_config)) is cfg
    assert cfg == resolve(run_config)
    for change in (
        lambda: cfg.__setitem__("lr", 1.0),
        lambda: cfg.update(lr=1.0),
        lambda: cfg.pop("lr"),
        lambda: cfg.clear(),
    ):
        with pytest.raises(TypeError, match="do not change"):
            change()
    assert cfg["lr"] == 0.5
    for twin in (copy.deepcopy(cfg), pickle.loads(pickle.dumps(cfg))):
        assert twin == cfg and isinstance(twin, settings.FrozenSettings)
        assert settings.settings_key(twin) == settings.settings_key(cfg)
