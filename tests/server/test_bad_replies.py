"""Every kind of bad reply, for every registered algorithm and each phase of its round, is
skipped with a logged reason, never aggregated, and the run goes on.

One run per algorithm corrupts client 0's reply in one phase per round (round k: the k-th
phase; the final evaluation last). Inside that run every corruption of the real reply is put
through the engine's own screening (`Engine.screen`, what `exchange` applies to each reply) with
the phase's real validator, and its reason is checked; the reply actually delivered is the most
harmful one (NaN arrays, or an infinite metric). A second run drops the same replies instead:
both runs must end with the same strategy state and the same final evaluation.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from client.app import app as client_app
from pollen.core import protocol
from pollen.core.registry import ALGORITHMS, get_algorithm
from pollen.core.rundir import read_jsonl
from server.engine import Engine
from server.results import ResultsWriter
from strategies.base import Fold, Validator, strategy_class
from tests.fakes import FakeClock, FakeGrid, settings_of

# algorithm -> (its small settings, the phases of its round in order; "evaluate" is the final
# one), from the registry: a new algorithm is in the matrix without a line here
ROUNDS: dict[str, tuple[dict[str, Any], list[str]]] = {
    name: (dict(spec.small), list(spec.round_phases())) for name, spec in ALGORITHMS.items()
}
MAX_REPLY_MB = 4.0
# Two in-process runs that should agree differ by float rounding, which a round of training (and
# FeDLRT's truncation) amplifies: up to ~1e-4 (FeDLRT) here. A reply wrongly averaged
# in moves weights by ~1e-2 and a NaN or Inf everywhere, so arrays are compared to 1e-3 and
# metrics (an accuracy may flip by one example) to 1e-2.
TOL = 1e-3
METRIC_TOL = 1e-2

# corruption -> what the logged reason must say
ARRAY_KINDS = {
    "nan": "NaN or Inf",
    "inf": "NaN or Inf",
    "shape": "shape",
    "dtype": "dtype",
    "missing-key": "keys differ",
    "extra-key": "keys differ",
    "missing-record": "missing array record",
    "truncated-bundle": "array bundle too short",
    "bundle-header": "header is not JSON",
    "flower-record": "not a Pollen array bundle",
}
RANK_KIND = {"rank": "shape"}  # a factor or coefficient matrix of another rank (FeDLRT)
GENERIC_KINDS = {
    "absurd-examples": "num-examples",
    "negative-examples": "num-examples",
    "fractional-examples": "num-examples",
    "oversized": "exceeds max-reply-mb",
    "stale-round": "reply for round",
    "other-phase": "reply for phase",
    "other-client": "reply from client",
    "no-envelope": "no 'pollen' envelope",
    "no-metrics": "no metrics record",
    "inf-metric": "not finite",
    "nan-metric": "not finite",
}


def _truncated(values: dict[str, np.ndarray]) -> ArrayRecord:
    whole = protocol.to_record(values)[protocol.BUNDLE]
    return ArrayRecord({protocol.BUNDLE: Array("uint8", (1,), protocol.BUNDLE, whole.data[:-1])})


def _bad_header(values: dict[str, np.ndarray]) -> ArrayRecord:
    data = (3).to_bytes(4, "little") + b"{[}" + bytes(8)
    return ArrayRecord({protocol.BUNDLE: Array("uint8", (len(data),), protocol.BUNDLE, data)})


def _flower_record(values: dict[str, np.ndarray]) -> ArrayRecord:
    """The arrays as Flower's own ArrayRecord (one Array per key), not Pollen's bundle."""
    return ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in values.items()})


BUNDLE_KINDS: dict[str, Callable[[dict[str, np.ndarray]], ArrayRecord]] = {
    "truncated-bundle": _truncated,
    "bundle-header": _bad_header,
    "flower-record": _flower_record,
}


def _arrays(content: RecordDict) -> list[str]:
    return sorted(n for n, r in content.items() if isinstance(r, ArrayRecord))


def corrupt(content: RecordDict, kind: str) -> RecordDict:
    """A copy of a real reply with one thing wrong."""
    out = RecordDict(dict(content.items()))
    names = _arrays(content)
    if kind in ARRAY_KINDS or kind in RANK_KIND:
        name = names[0]
        values = protocol.from_record(content[name])  # type: ignore[arg-type]
        if kind in BUNDLE_KINDS:
            out[name] = BUNDLE_KINDS[kind](values)
            return out
        key = sorted(values)[0]
        if kind == "rank":
            key = next(k for k in sorted(values) if k.endswith((".S", ".U", ".V")))
        arr = values[key]
        if kind in ("nan", "inf"):
            arr = arr.astype(arr.dtype)
            arr.flat[arr.size // 2] = np.nan if kind == "nan" else -np.inf
        elif kind == "shape":
            arr = np.concatenate([arr.ravel(), arr.ravel()[:1]])
        elif kind == "dtype":
            arr = arr.astype(np.float64 if arr.dtype == np.float32 else np.float32)
        elif kind == "rank":
            arr = arr[:-1, :-1] if key.endswith(".S") else arr[:, :-1]
        values[key] = arr
        if kind == "missing-key":
            del values[key]
        if kind == "extra-key":
            values["extra"] = np.zeros(3, np.float32)
        out[name] = protocol.to_record(values)
        if kind == "missing-record":
            del out[name]
        return out
    envelope = dict(content[protocol.ENVELOPE])  # type: ignore[arg-type]
    metrics = dict(content[protocol.METRICS])  # type: ignore[arg-type]
    if kind == "absurd-examples":
        metrics[protocol.NUM_EXAMPLES] = 10**12
    elif kind == "negative-examples":
        metrics[protocol.NUM_EXAMPLES] = -5
    elif kind == "fractional-examples":
        metrics[protocol.NUM_EXAMPLES] = 2.5
    elif kind == "oversized":
        out["padding"] = protocol.to_record(
            {"x": np.zeros(int(MAX_REPLY_MB * 1e6) // 4 + 1, np.float32)}
        )
    elif kind == "stale-round":
        envelope["round"] = protocol.round_of(content) - 1
    elif kind == "other-phase":
        envelope["message-type"] = "query.other"
    elif kind == "other-client":
        envelope["client-id"] = 2
    elif kind in ("inf-metric", "nan-metric"):
        metrics["train-loss"] = float("inf") if kind == "inf-metric" else float("nan")
    out[protocol.ENVELOPE] = ConfigRecord(envelope)  # type: ignore[arg-type]
    out[protocol.METRICS] = MetricRecord(metrics)  # type: ignore[arg-type]
    if kind == "no-envelope":
        del out[protocol.ENVELOPE]
    if kind == "no-metrics":
        del out[protocol.METRICS]
    return out


class ScreeningEngine(Engine):
    """Remembers each phase's validator so that a fault can screen variants of a real reply."""

    validators: dict[str, Validator | None]

    def exchange(
        self,
        message_type: str,
        payloads: Mapping[int, RecordDict],
        validate: Validator | None = None,
        min_replies: int | None = None,
        fold: Fold | None = None,
    ) -> dict[int, RecordDict]:
        self.validators[message_type] = validate
        return super().exchange(message_type, payloads, validate, min_replies, fold)


def _settings(run_config: dict[str, Any], algorithm: str, tag: str) -> dict[str, Any]:
    extra, phases = ROUNDS[algorithm]
    final_eval = "evaluate" in get_algorithm(algorithm).message_types
    return settings_of({
        **run_config, "algorithm": algorithm, "num-rounds": len(phases), "server-eval": False,
        "final-eval": final_eval,
        "max-reply-mb": MAX_REPLY_MB, "out-dir": f"{run_config['out-dir']}-{tag}",
        "run-name": tag, **extra,
    })  # fmt: skip


def _run(
    cfg: dict[str, Any],
    fault: Callable[[ScreeningEngine, int, Message], Any],
    leaky: bool = False,
) -> tuple[ScreeningEngine, dict[str, Any]]:
    """Runs with `fault(engine, node, message)` deciding the fate of each message."""
    grid = FakeGrid(client_app, int(cfg["num-clients"]), cfg)
    grid.leaky = leaky
    clock = FakeClock()
    strategy = strategy_class(get_algorithm(str(cfg["algorithm"])))(cfg)
    engine = ScreeningEngine(
        grid, cfg, strategy, ResultsWriter(cfg["out-dir"]), clock=clock, sleep=clock.sleep
    )
    engine.validators = {}
    grid.faults.append(lambda node, msg, _: fault(engine, node, msg))
    return engine, engine.run()


def _untimed(metrics: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in metrics.items() if "seconds" not in k}


def test_every_algorithm_declares_the_phases_of_its_round() -> None:
    for name, (_, phases) in ROUNDS.items():
        assert phases, f"{name}: a round of no phase"
        assert set(phases) <= set(get_algorithm(name).message_types)
    fedlrt = ["query.fedlrt_basis", "query.fedlrt_coef_grad", "train.fedlrt_coef"]
    assert ROUNDS["fedlrt"][1] == fedlrt
    assert ROUNDS["fedsc"][1] == ["query.correlation", "train"]


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", sorted(ROUNDS))
def test_bad_replies_are_skipped_with_a_reason_in_every_phase(
    run_config: dict[str, Any], algorithm: str
) -> None:
    final_eval = "evaluate" in get_algorithm(algorithm).message_types
    phases = [*ROUNDS[algorithm][1], *(["evaluate"] if final_eval else [])]

    def targeted(msg: Message) -> str | None:
        """The phase whose reply from client 0 is bad in this message's round."""
        rnd = int(msg.metadata.group_id)
        phase = phases[min(rnd, len(phases)) - 1]
        return phase if msg.metadata.message_type == phase else None

    def drop(_engine: ScreeningEngine, node: int, msg: Message) -> Any:
        return "drop" if node == 100 and targeted(msg) else None

    reasons: dict[tuple[str, str], str | None] = {}

    def spoil(engine: ScreeningEngine, node: int, msg: Message) -> Any:
        phase = targeted(msg)
        if node != 100 or phase is None:
            return None

        def change(reply: RecordDict) -> RecordDict:
            validate = engine.validators[phase]
            kinds = dict(GENERIC_KINDS)
            if _arrays(reply):
                kinds.update(ARRAY_KINDS)
                if algorithm == "fedlrt":
                    kinds.update(RANK_KIND)
            assert engine.screen(reply, phase, 0, validate) is None  # the real reply is fine
            for kind in kinds:
                reasons[phase, kind] = engine.screen(corrupt(reply, kind), phase, 0, validate)
            return corrupt(reply, "nan" if _arrays(reply) else "inf-metric")

        return change

    ref_cfg = _settings(run_config, algorithm, "dropped")
    bad_cfg = _settings(run_config, algorithm, "corrupted")
    ref, ref_summary = _run(ref_cfg, drop)
    bad, bad_summary = _run(bad_cfg, spoil)

    # every corruption was screened out, with the reason that names it
    assert {p for p, _ in reasons} == set(phases)
    for (phase, kind), reason in sorted(reasons.items()):
        expected = {**ARRAY_KINDS, **RANK_KIND, **GENERIC_KINDS}[kind]
        assert reason is not None, f"{algorithm} {phase}: a reply with {kind} was accepted"
        assert reason.startswith("invalid reply") and expected in reason, (phase, kind, reason)

    # the delivered bad reply was logged as skipped, the run completed, nothing was aggregated
    rows = read_jsonl(Path(bad_cfg["out-dir"]) / "metrics.jsonl")
    for rnd, row in enumerate(rows, start=1):
        failed: dict[str, Any] = {}
        for p in row["phases"]:  # a phase's first exchange (FeDLRT may redo its train phase)
            failed.setdefault(p["phase"], p["failed"])
        assert failed[phases[rnd - 1]]["0"].startswith("invalid reply")
    if final_eval:
        final_phases = {p["phase"]: p["failed"] for p in bad_summary["final"]["phases"]}
        assert "not finite" in final_phases["evaluate"]["0"]
    assert bad_summary["status"] == ref_summary["status"] == "completed"
    ref_arrays, ref_meta = ref.strategy.state()
    bad_arrays, bad_meta = bad.strategy.state()
    assert bad_meta == ref_meta and set(bad_arrays) == set(ref_arrays)
    for key, value in ref_arrays.items():
        np.testing.assert_allclose(bad_arrays[key], value, rtol=TOL, atol=TOL, err_msg=key)
    assert _untimed(bad_summary["final"].get("eval", {})) == pytest.approx(
        _untimed(ref_summary["final"].get("eval", {})), rel=METRIC_TOL, abs=METRIC_TOL
    )
    ref_rows = read_jsonl(Path(ref_cfg["out-dir"]) / "metrics.jsonl")
    for row, ref_row in zip(rows, ref_rows, strict=True):
        want = _untimed(ref_row["train"])
        assert _untimed(row["train"]) == pytest.approx(want, rel=METRIC_TOL, abs=METRIC_TOL)
    summary = json.loads(Path(bad_cfg["out-dir"], "summary.json").read_text())
    assert summary["status"] == "completed"  # as written to disk
