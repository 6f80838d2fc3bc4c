"""What the two halves of a Flower app share: an algorithm's settings as keyword arguments, and
the settings travelling with every instruction.

A Flower app's run config holds the app's own keys, not Pollen's settings, so the server sends
the run's settings with each instruction (record `pollen.settings`) and the client half resolves
them as Pollen's ClientApp resolves its run config: every key known, every value checked.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from flwr.app import ConfigRecord, RecordDict

from pollen.core.registry import get_algorithm
from pollen.core.runconfig import COMMON_SETTINGS, all_settings, resolve
from pollen.core.settings import Scalar, SettingsError

__all__ = [
    "OWN_MODEL", "SETTINGS", "SettingsError", "keyword_settings", "settings_of", "with_settings"
]  # fmt: skip

SETTINGS = "pollen.settings"
"""The record of an instruction that carries the run's settings."""

OWN_MODEL = frozenset(
    {"fedavg", "fedavg-plus", "fedprox", "fedem", "d-fedem", "clustered", "fedlrt", "fedlin",
     "scaffold", "local"}
)  # fmt: skip
"""The algorithms whose clients train a classifier a user's `model_fn` can build (the others
build their models from their settings: FedSC's encoders, ADEPT's models)."""

SET_BY_START = {
    "algorithm": "the strategy's class",
    "num-rounds": "start(num_rounds=...)",
    "phase-timeout": "start(timeout=...)",
    "simulation-nodes": "one client per SuperNode in a Flower app",
}
"""Settings a strategy's keyword arguments do not take, and what sets them instead."""


def _snake(key: str) -> str:
    return key.replace(".", "_").replace("-", "_")


def keyword_settings(algorithm: str) -> dict[str, str]:
    """The keyword arguments of `algorithm`'s strategy, each with the setting it names: the
    common settings (`local-epochs` -> local_epochs, `robust.rule` -> robust_rule), and the
    algorithm's own groups and those it uses (`fedem.components` -> components),
    the group's name kept where the short name is taken (`adept-ae.local-steps` ->
    adept_ae_local_steps)."""
    spec = get_algorithm(algorithm)
    names = {_snake(s.key): s.key for s in COMMON_SETTINGS if s.key not in SET_BY_START}
    declared = set(all_settings()) - set(names.values()) - set(SET_BY_START)
    groups = spec.setting_groups()
    for key in sorted(declared):
        group, dot, short = key.partition(".")
        if not dot or group not in groups:
            continue
        name = _snake(short)
        names[_snake(key) if name in names else name] = key
    return names


def overrides(algorithm: str, kwargs: Mapping[str, Any]) -> dict[str, Scalar]:
    """The settings named by keyword arguments, checked (SettingsError names the first bad
    one); the algorithm's defaults fill the rest in `resolve`."""
    names = keyword_settings(algorithm)
    out: dict[str, Any] = {}
    for name, value in kwargs.items():
        if name not in names:
            raise SettingsError(f"{algorithm} has no setting {name!r}{_nearest(name, names)}")
        out[names[name]] = value
    resolve_for_any_count({"algorithm": algorithm, **out})  # every value checked now
    return out


POOLS = (10, 100, 1000)
"""Client counts a strategy's settings are also checked at when the default count (num-clients)
refuses them and the argument was not given: the grid decides it at start."""


def resolve_for_any_count(cfg: Mapping[str, Any]) -> dict[str, Scalar]:
    """`resolve(cfg)`; where only the client count refuses it (Krum's f against a round's
    clients, say) and `cfg` does not give one, the settings at the first count of POOLS that
    takes them: start() counts the SuperNodes the grid has and checks again with their number.
    Otherwise the default count's SettingsError."""
    try:
        return resolve(cfg)
    except SettingsError:
        if "num-clients" in cfg:
            raise
        for clients in POOLS:
            try:
                return resolve({**cfg, "num-clients": clients})
            except SettingsError:
                pass
        raise


def config_settings(
    algorithm: str, config: Mapping[str, Any], what: str = "train_config"
) -> dict[str, Scalar]:
    """Settings named in a Flower config (a `train_config`, a run config): each key a keyword
    argument (`local_epochs`) or the setting it names (`local-epochs`, `fedem.components`);
    SettingsError names the first key that is neither."""
    names = keyword_settings(algorithm)
    keys = set(names.values())
    out: dict[str, Scalar] = {}
    for key, value in config.items():
        setting = names.get(key) or names.get(_snake(key)) or (key if key in keys else None)
        if setting is None:
            raise SettingsError(
                f"{what}: {key!r} is no setting of {algorithm}{_nearest(_snake(key), names)}; "
                f"pollen.flower.keyword_settings({algorithm!r}) lists them"
            )
        out[setting] = value
    return out


def run_config_kwargs(
    algorithm: str, run_config: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, str]]:
    """The keyword arguments a Flower run config names (`local-epochs = 2` -> local_epochs=2;
    keys as in `config_settings`), and the keys that name no setting, each with a note (the
    nearest setting, if any): the app's own keys, such as `num-server-rounds`."""
    names = keyword_settings(algorithm)
    kwarg_of = {setting: name for name, setting in names.items()}
    kwargs: dict[str, Any] = {}
    ignored: dict[str, str] = {}
    for key, value in run_config.items():
        try:
            (setting,) = config_settings(algorithm, {key: value}, "run config")
        except SettingsError:
            ignored[key] = _nearest(_snake(key), names)
            continue
        kwargs[kwarg_of[setting]] = value
    return kwargs, ignored


def _nearest(name: str, names: Mapping[str, str]) -> str:
    close = difflib.get_close_matches(name, list(names), n=2)
    return f" (did you mean {' or '.join(close)}?)" if close else ""


def with_settings(content: RecordDict, settings: Mapping[str, Scalar]) -> None:
    """Adds the run's settings to an instruction's content."""
    content[SETTINGS] = ConfigRecord(dict(settings))


def settings_of(content: RecordDict) -> dict[str, Scalar]:
    """The run's settings an instruction carries, resolved and checked, and removed from the
    content (the algorithm's handler sees the instruction as Pollen's ClientApp does)."""
    record = content.get(SETTINGS)
    if not isinstance(record, ConfigRecord):
        raise SettingsError(
            "the instruction carries no Pollen settings: is the ServerApp running a "
            "pollen.flower strategy?"
        )
    del content[SETTINGS]
    return resolve(dict(record))
