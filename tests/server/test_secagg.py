"""Secure aggregation run by the real engine and ClientApp over an in-process grid: what the server
receives, the unmasked sums against the plain ones for every algorithm, clients lost at every
stage, too many lost, resent instructions and a resumed run (server.secagg, client.secagg)."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import ArrayRecord, Message, RecordDict

import client.secagg as client_secagg
from client.app import app as client_app
from pollen.core import protocol
from pollen.core.contracts import secagg as contract
from pollen.core.protection import SecAggSettings
from pollen.core.registry import ALGORITHMS
from pollen.core.rundir import read_jsonl
from secagg import encoding
from server.engine import Engine, PhaseFailed
from server.results import ResultsWriter
from strategies.base import Secured, Summed, strategy_class
from tests.fakes import FakeClock, FakeGrid, exact_sum, settings_of

SECURE = sorted(n for n, spec in ALGORITHMS.items() if spec.secagg)


@dataclass
class Record:
    """What a secure run did: each secure sum the strategy asked for, each client's reply
    before it was masked, and every reply the server received."""

    sums: list[tuple[int, str, dict[int, RecordDict], Summed, Secured]] = field(
        default_factory=list
    )
    clear: dict[tuple[int, int], RecordDict] = field(default_factory=dict)
    """By (the index of the secure sum in `sums`, client id)."""
    received: list[Message] = field(default_factory=list)


class RecordingGrid(FakeGrid):
    def __init__(self, record: Record, *args: Any) -> None:
        super().__init__(*args)
        self.record = record

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        pulled = list(super().pull_messages(message_ids))
        self.record.received.extend(pulled)
        return pulled


class RecordingEngine(Engine):
    record: Record

    def secure_exchange(
        self,
        message_type: str,
        payloads: Mapping[int, RecordDict],
        summed: Summed,
        min_replies: int | None = None,
    ) -> Secured:
        secured = super().secure_exchange(message_type, payloads, summed, min_replies)
        self.record.sums.append((self.server_round, message_type, dict(payloads), summed, secured))
        return secured


@pytest.fixture
def record(monkeypatch: pytest.MonkeyPatch) -> Iterator[Record]:
    rec = Record()
    masked = client_secagg.masked

    def keep_clear(reply: RecordDict, instruction: RecordDict, env: Any) -> RecordDict:
        rec.clear[(len(rec.sums), env.cid)] = copy.deepcopy(reply)  # the sum under way
        return masked(reply, instruction, env)

    monkeypatch.setattr(client_secagg, "masked", keep_clear)
    yield rec


def _run(
    run_config: dict[str, Any],
    record: Record,
    algorithm: str = "fedavg",
    clients: int = 5,
    faults: Iterable[Any] = (),
    settings: Mapping[str, Any] | None = None,
    errors_as_replies: bool = False,
) -> tuple[dict[str, Any], dict[str, Any]]:
    spec = ALGORITHMS[algorithm]
    cfg = settings_of({
        **run_config, "algorithm": algorithm, **spec.small, "num-clients": clients,
        "num-rounds": 1, "secagg.enabled": True, "final-eval": False, "server-eval": False,
        "resend-limit": 0, **(settings or {}),
    })  # fmt: skip
    grid = RecordingGrid(record, client_app, clients, cfg)
    grid.faults.extend(faults)
    grid.errors_as_replies = errors_as_replies  # a client's refusal: its error reply
    clock = FakeClock()
    engine = RecordingEngine(grid, cfg, strategy_class(spec)(cfg), ResultsWriter(cfg["out-dir"]),
                             clock=clock, sleep=clock.sleep)  # fmt: skip
    engine.record = record
    try:
        summary = engine.run()
    except PhaseFailed:
        summary = json.loads((Path(cfg["out-dir"]) / "summary.json").read_text())
    return summary, cfg


def _check_sums(record: Record, cfg: Mapping[str, Any]) -> int:
    """Every secure sum of the run against the exact sum of the same clients' clear replies
    (weighted as they encoded their weights): within count x step x scale on every value."""
    secagg = SecAggSettings.of(cfg)
    checked = 0
    for index, (_, phase, payloads, summed, secured) in enumerate(record.sums):
        clients = secured.clients
        replies = {c: record.clear[(index, c)] for c in clients}
        for reply in secured.replies.values():  # no metric of what the sum hides
            assert not set(contract.PROTECTED_METRICS) & set(protocol.metrics_of(reply))
        oracle = exact_sum(payloads, replies, summed, secured.weights)
        scale = max(secured.weights.values()) if summed.weighted else 1.0
        step = (summed.clip or secagg.clip) / 2 ** (secagg.bits - 1)
        bound = len(clients) * step * max(scale, 1.0) * (1 + 1e-9)
        assert secured.weight == pytest.approx(oracle.weight, rel=1e-12)
        for name, arrays in oracle.sums.items():
            assert set(secured.sums[name]) == set(arrays)  # the floating-point arrays
            for key in arrays:
                error = np.abs(secured.sums[name][key] - oracle.sums[name][key]).max()
                assert error <= bound, (phase, name, key, error, bound)
        checked += 1
    return checked


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", SECURE)
def test_every_algorithm_s_unmasked_sums_are_the_plain_sums_within_the_bound(
    run_config: dict[str, Any], record: Record, algorithm: str
) -> None:
    summary, cfg = _run(run_config, record, algorithm, clients=3)
    assert summary["status"] == "completed", summary.get("reason")
    phases = {p for _, p, *_ in record.sums}
    assert phases >= set(ALGORITHMS[algorithm].round_phases()) - {"evaluate"}
    assert _check_sums(record, cfg) == len(record.sums) > 0


def test_the_server_receives_no_update_and_masked_inputs_look_uniform(
    run_config: dict[str, Any], record: Record
) -> None:
    summary, cfg = _run(run_config, record)
    assert summary["status"] == "completed"
    modulus_bits = contract.modulus_bits(cfg)
    train = [m for m in record.received if m.metadata.message_type == "train"]
    assert len(train) == 5
    ((_, _, payloads, _, _),) = record.sums
    for msg in record.received:
        arrays = [n for n, r in msg.content.items() if isinstance(r, ArrayRecord)]
        assert protocol.ARRAYS not in arrays  # no model, no update, in any reply
    for msg in train:
        cid = protocol.as_int(msg.content[protocol.ENVELOPE][protocol.CLIENT_ID])  # type: ignore[index]
        y = protocol.arrays_of(msg.content, contract.MASKED)[contract.Y].astype(np.float64)
        assert y.max() < 2**modulus_bits
        # uniform over the modulus: 16 bins of the range, chi-square at p = 1e-6
        counts = np.bincount((y // 2 ** (modulus_bits - 4)).astype(int), minlength=16)
        expected = y.size / 16
        assert ((counts - expected) ** 2 / expected).sum() < 52.0
        # and unrelated to the client's update (its model minus the model it was sent)
        clear = record.clear[(0, cid)]
        sent = protocol.arrays_of(payloads[cid])
        update = np.concatenate([
            (protocol.arrays_of(clear)[k].astype(np.float64) - sent[k]).ravel()
            for k in sorted(sent)
        ])  # fmt: skip
        r = np.corrcoef(update, y[:-1])[0, 1]
        assert abs(r) < 5 / np.sqrt(update.size)


def _drop(stage: str, clients: set[int], first: int = 100) -> Any:
    """A fault: the nodes of `clients` never answer `stage` in round 1."""

    def fault(node: int, msg: Message, _: Any) -> str | None:
        if (
            msg.metadata.message_type == stage
            and msg.metadata.group_id == "1"
            and node - first in clients
        ):
            return "drop"
        return None

    return fault


@pytest.mark.parametrize(
    ("stage", "in_sum"),
    [(contract.KEYS, 4), (contract.SHARES, 4), ("train", 4), (contract.UNMASK, 5)],
)
def test_a_client_lost_at_any_stage_leaves_a_sum_of_the_others(
    run_config: dict[str, Any], record: Record, stage: str, in_sum: int
) -> None:
    summary, cfg = _run(
        run_config, record, faults=[_drop(stage, {1})], settings={"phase-timeout": 5.0}
    )
    assert summary["status"] == "completed", summary.get("reason")
    ((_, _, _, _, secured),) = record.sums
    assert len(secured.clients) == in_sum and (1 in secured.clients) == (in_sum == 5)
    assert _check_sums(record, cfg) == 1
    row = read_jsonl(Path(cfg["out-dir"]) / "metrics.jsonl")[0]
    lost = [p for p in row["phases"] if p["phase"] == stage]
    assert lost and lost[0]["failed"] == {"1": "no reply within 5 s"}


def test_too_few_survivors_stop_the_round_before_anything_is_unmasked(
    run_config: dict[str, Any], record: Record
) -> None:
    # 5 clients, a complete graph, t = 3: three lost after sharing their keys leave two
    summary, _ = _run(run_config, record, faults=[_drop("train", {0, 2, 4})],
                      settings={"phase-timeout": 5.0})  # fmt: skip
    assert summary["status"] == "failed"
    assert "nothing of it is revealed" in summary["reason"]
    assert not [m for m in record.received if m.metadata.message_type == contract.UNMASK]
    assert record.sums == []


def test_lost_replies_are_asked_again_and_answered_alike(
    run_config: dict[str, Any], record: Record
) -> None:
    lost: set[tuple[int, str]] = set()

    def lose_once(node: int, msg: Message, _: Any) -> str | None:
        key = (node, msg.metadata.message_type)
        if node == 102 and key not in lost:
            lost.add(key)
            return "lost"  # answered, the reply lost: the client ran the stage
        return None

    summary, cfg = _run(run_config, record, faults=[lose_once], settings={"resend-limit": 2})
    assert summary["status"] == "completed", summary.get("reason")
    assert {t for _, t in lost} == {"query.hello", *contract.STAGES, "train"}
    row = read_jsonl(Path(cfg["out-dir"]) / "metrics.jsonl")[0]
    assert all(p["resent"] == {"2": 1} for p in row["phases"])
    ((_, _, _, _, secured),) = record.sums
    assert len(secured.clients) == 5
    assert _check_sums(record, cfg) == 1


def test_a_resumed_run_goes_on_with_new_sessions(
    run_config: dict[str, Any], record: Record
) -> None:
    summary, cfg = _run(run_config, record, settings={"num-rounds": 2})
    assert summary["status"] == "completed"
    summary, cfg = _run(run_config, record, settings={"num-rounds": 3, "resume": True})
    assert summary["status"] == "completed"
    rows = read_jsonl(Path(cfg["out-dir"]) / "metrics.jsonl")
    assert [r["round"] for r in rows] == [1, 2, 3]
    sessions = {
        m.metadata.group_id for m in record.received if m.metadata.message_type == contract.KEYS
    }
    assert sessions == {"1", "2", "3"}


def test_no_individual_update_reaches_a_results_file_or_the_log(
    run_config: dict[str, Any], record: Record, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG")
    summary, cfg = _run(run_config, record, settings={"num-rounds": 2, "final-eval": True})
    assert summary["status"] == "completed"
    out = Path(cfg["out-dir"])
    clear = [protocol.arrays_of(r) for r in record.clear.values()]
    rows = [np.concatenate([np.ravel(a[k]) for k in sorted(a)]) for a in clear]
    texts = [caplog.text]
    arrays: list[np.ndarray] = []
    for path in out.rglob("*"):
        if not path.is_file() or "client-state" in path.parts:  # the clients' own storage
            continue
        if path.suffix == ".npz":
            with np.load(path) as npz:
                arrays += [npz[k].ravel() for k in npz.files]
        else:
            texts.append(path.read_text(errors="replace"))
    found = [r for r in rows for a in arrays if a.size == r.size and np.allclose(a, r)]
    assert arrays and not found  # the checkpoint and final model hold the aggregate only
    text = "\n".join(texts)
    for row in rows:  # the leading values of each client's model, written any way
        for value in row[:3]:
            assert repr(float(value)) not in text and f"{value:.6g}" not in text


@pytest.mark.parametrize("outside", [False, True])
def test_a_masked_input_off_the_protocol_is_caught(
    run_config: dict[str, Any], record: Record, outside: bool
) -> None:
    """A value at or above the modulus makes the reply invalid (the client is left out, as
    lost); a value within it can be anything, and only the unmasked sum can show it: a weight
    beyond what the clients of the sum can carry stops the round."""
    bits = 25  # the modulus of a sum of 5 clients of 22-bit values

    def tamper(node: int, msg: Message, _: Any) -> Any:
        if node != 101 or msg.metadata.message_type != "train":
            return None

        def change(content: RecordDict) -> RecordDict:
            y = protocol.arrays_of(content, contract.MASKED)[contract.Y]
            if outside:
                y[-1] = np.uint32(2**bits)
            else:  # 4 weights more on the weight coordinate
                y[-1] = (int(y[-1]) + 2**23) % 2**bits
            content[contract.MASKED] = protocol.to_record({contract.Y: y})
            return content

        return change

    summary, cfg = _run(run_config, record, faults=[tamper])
    assert contract.modulus_bits(cfg) == bits
    if outside:
        assert summary["status"] == "completed"
        ((_, _, _, _, secured),) = record.sums
        assert 1 not in secured.clients and len(secured.clients) == 4
        assert _check_sums(record, cfg) == 1
    else:
        assert summary["status"] == "failed"
        assert "did not follow the protocol" in summary["reason"]


def test_the_encoding_bound_the_tests_use_is_the_documented_one() -> None:
    enc = encoding.Encoding(8.0, 22, 32)
    assert enc.step == 8.0 / 2**21
    assert encoding.mean_error_bound(5, 5.0, enc) == enc.step


def _final_state(cfg: Mapping[str, Any]) -> dict[str, np.ndarray]:
    with np.load(Path(cfg["out-dir"]) / "checkpoint" / "state.npz") as npz:
        return {k: npz[k] for k in npz.files}


def _initial_state(cfg: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """The strategy's state before round 1, as the engine initializes it."""
    strategy = strategy_class(ALGORITHMS[cfg["algorithm"]])(cfg)
    strategy.initialize(int(cfg["seed"]))
    return dict(strategy.state()[0])


ROUND_AGREEMENT = 1e-2
"""How close the secure round's state is to the plain round's, as a share of how far the plain
round moved it (each array's Frobenius norm). The sums agree to 1e-11 at 40 bits, but local
training after the server's step amplifies last-bit differences of the plain round's float32
arithmetic, by amounts that change with the CPU's vector kernels: on one AVX-512 machine, 1.1e-3
of the step for FeDLRT with its full variance correction and dense correction (7e-7 without the
dense correction), at most 6e-6 for every other algorithm; on AVX2 the same FeDLRT round agreed
to 1e-6. A strategy that used a sum wrongly (a sum for a mean, a missing client, another
client's share) is off by a share of order one."""


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", SECURE)
def test_every_algorithm_s_secure_round_ends_where_its_plain_round_does(
    run_config: dict[str, Any], record: Record, algorithm: str
) -> None:
    """The same round with and without secure aggregation, its sums encoded finely enough
    (40 bits) that rounding is negligible: the strategy ends where the plain round does, to
    within ROUND_AGREEMENT of the round's own step, so it uses the sums as the plain round uses
    the replies (the sums themselves are checked against the bound by the test above). FeDLRT
    keeps a fixed rank (tau 0: the cap), so that no truncation at a threshold can flip between
    the two runs. Integer arrays are not summed: the server keeps the value it sent (BatchNorm's
    counters)."""
    fixed = {"fedlrt.tau": 0.0} if algorithm == "fedlrt" else {}
    plain = {**run_config, "out-dir": f"{run_config['out-dir']}-plain"}
    summary, cfg = _run(plain, record, algorithm, clients=3,
                        settings={"secagg.enabled": False, **fixed})  # fmt: skip
    assert summary["status"] == "completed"
    summary, secure_cfg = _run(
        run_config, record, algorithm, clients=3, settings={"secagg.bits": 40, **fixed}
    )
    assert summary["status"] == "completed"
    assert contract.modulus_bits(secure_cfg) > 32  # the 64-bit wire
    initial, before, after = _initial_state(cfg), _final_state(cfg), _final_state(secure_cfg)
    # FedSC's server keeps each client's matrix in the clear, under secure aggregation their sum
    assert set(before) ^ set(after) <= {f"fedsc-correlation/{c}" for c in range(3)} | {
        "fedsc-shared-sum"
    }
    moved = 0
    for key in sorted(set(before) & set(after)):
        assert after[key].shape == before[key].shape, key
        if before[key].dtype.kind != "f":
            continue
        gap = float(np.linalg.norm(after[key].astype(np.float64) - before[key]))
        start = initial.get(key)
        if start is not None and start.shape == before[key].shape:
            step = float(np.linalg.norm(before[key].astype(np.float64) - start))
        else:  # new in the round (FedSC's sums, FedEM's weights), or of another shape
            step = float(np.linalg.norm(before[key].astype(np.float64)))
        moved += step > 0
        assert gap <= ROUND_AGREEMENT * step + 1e-12, (key, gap, step)
    assert moved > 0  # the round changed the state: the comparison is not of two initial states


def _no_two_sums_differ_by_few(record: Record, fewest: int) -> None:
    """Of every two sums of one phase in a round, the later is over the earlier's clients or a
    subset missing `fewest` of them at least: no difference is the input of fewer clients."""
    by_phase: dict[tuple[int, str], list[set[int]]] = {}
    for rnd, phase, _, _, secured in record.sums:
        by_phase.setdefault((rnd, phase), []).append(set(secured.clients))
    for sets in by_phase.values():
        for i, earlier in enumerate(sets):
            for later in sets[i + 1 :]:
                assert later == earlier or (later <= earlier and len(earlier - later) >= fewest)


@pytest.mark.parametrize("lost_in", ["query.fedlrt_coef_grad", "train.fedlrt_coef"])
def test_fedlrt_starts_its_round_again_without_a_sum_that_differs_by_one_client(
    run_config: dict[str, Any], record: Record, lost_in: str
) -> None:
    """A client lost after the basis phase leaves the corrections of the others built from a
    mean over it: the round starts again from the basis phase with the clients still in every
    sum less m = 2 more (drawn from the run's seed), since the basis gradients are the same
    input in both starts: the difference of two sums of them is never one client's."""
    summary, cfg = _run(run_config, record, "fedlrt", clients=7,
                        faults=[_drop(lost_in, {1})], settings={"phase-timeout": 5.0})  # fmt: skip
    assert summary["status"] == "completed", summary.get("reason")
    row = read_jsonl(Path(cfg["out-dir"]) / "metrics.jsonl")[0]
    assert row["train"]["restarts"] == 1.0
    phases = [p for _, p, *_ in record.sums]
    first = phases.index(lost_in) + 1
    assert phases[first:] == ["query.fedlrt_basis", "query.fedlrt_coef_grad", "train.fedlrt_coef"]
    clients = [set(s.clients) for *_, s in record.sums]
    assert clients[0] == set(range(7)) and 1 not in clients[first - 1]
    assert clients[first] < clients[first - 1] and len(clients[first - 1] - clients[first]) == 2
    _no_two_sums_differ_by_few(record, 2)
    assert _check_sums(record, cfg) == len(record.sums)


def _basis_difference(record: Record) -> tuple[np.ndarray, np.ndarray]:
    """The difference of the round's two sums of basis gradients, and the weighted gradient of
    the one client between them (its clear reply, as it encoded its weight)."""
    basis = [(i, s) for i, (_, p, _, _, s) in enumerate(record.sums) if p == "query.fedlrt_basis"]
    (i, first), (_, second) = basis[:2]
    (lost,) = set(first.clients) - set(second.clients)
    grads = "grads"
    diff = np.concatenate([
        (first.sums[grads][k] - second.sums[grads][k]).ravel() for k in sorted(first.sums[grads])
    ])  # fmt: skip
    clear = protocol.arrays_of(record.clear[(i, lost)], grads)
    own = np.concatenate([
        np.asarray(clear[k], np.float64).ravel() * first.weights[lost]
        for k in sorted(first.sums[grads])
    ])  # fmt: skip
    return diff, own


def test_fedlrt_s_restart_would_give_the_lost_client_s_gradient_without_the_defence(
    run_config: dict[str, Any], record: Record, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attack the defence stops: restarted over the clients less the lost one alone, with
    the server's and the clients' checks off, the two basis sums differ by exactly the lost
    client's weighted gradient (to the encoding's rounding). With the checks on, that restart
    is refused by the server and, the server's check off too, by the clients."""
    from strategies import fedlrt

    monkeypatch.setattr(fedlrt, "resummed", lambda settings, clients, seed: list(clients))
    settings = {"phase-timeout": 5.0}
    fault = [_drop("train.fedlrt_coef", {1})]
    summary, _ = _run(run_config, record, "fedlrt", clients=5, faults=fault, settings=settings)
    assert summary["status"] == "failed"
    assert "differs from an earlier sum of the same input" in summary["reason"]

    from server.secagg import SecureSum

    monkeypatch.setattr(SecureSum, "_no_differencing", lambda self, what, members: None)
    again = {**run_config, "out-dir": f"{run_config['out-dir']}-2"}
    summary, _ = _run(again, record, "fedlrt", clients=5, faults=fault, settings=settings,
                      errors_as_replies=True)  # fmt: skip
    assert summary["status"] == "failed"  # every client of the second basis sum refused
    assert "cannot unmask the sum: 0 shares" in summary["reason"]

    monkeypatch.setattr(client_secagg.Sessions, "no_differencing", lambda *a: None)
    record.sums.clear()
    record.clear.clear()
    undefended = {**run_config, "out-dir": f"{run_config['out-dir']}-3"}
    summary, cfg = _run(undefended, record, "fedlrt", clients=5, faults=fault, settings=settings)
    assert summary["status"] == "completed", summary.get("reason")
    diff, own = _basis_difference(record)
    step = SecAggSettings.of(cfg).clip / 2 ** (SecAggSettings.of(cfg).bits - 1)
    scale = max(record.sums[0][4].weights.values())
    assert np.abs(own).max() > 100 * step * scale  # a gradient, not rounding
    np.testing.assert_allclose(diff, own, atol=10 * step * scale)


DISTRIBUTED = {
    "client-dp.noise-multiplier": 0.5, "client-dp.clip": 1.0, "client-dp.noise-at": "client",
    "client-dp.reproducible": True,
}  # fmt: skip


def test_distributed_noise_is_the_central_noise_and_only_the_survivors_are_accounted(
    run_config: dict[str, Any], record: Record
) -> None:
    """Five clients share out the noise of z = 0.5 at clip 1; one is lost after sharing its
    keys: the sum carries 4/5 of the variance, and the ledger accounts just that (the Skellam
    mechanism of the survivors' noise; models.privacy.distributed_epsilon)."""
    from models.privacy import distributed_epsilon

    summary, cfg = _run(run_config, record, faults=[_drop("train", {3})],
                        settings={**DISTRIBUTED, "phase-timeout": 5.0})  # fmt: skip
    assert summary["status"] == "completed", summary.get("reason")
    ((_, _, payloads, summed, secured),) = record.sums
    assert summed.l2_clip == summed.clip == 1.0 and not summed.weighted
    assert summed.noise_std == 0.5 and len(secured.clients) == 4
    assert secured.noise_std == pytest.approx(0.5 * np.sqrt(4 / 5))
    # the noise in the sum: the unmasked sum minus the exact sum of the clipped updates
    replies = {c: record.clear[(0, c)] for c in secured.clients}
    oracle = exact_sum(payloads, replies, summed)
    noise = np.concatenate([
        (secured.sums["arrays"][k] - oracle.sums["arrays"][k]).ravel()
        for k in oracle.sums["arrays"]
    ])  # fmt: skip
    assert abs(float(noise.mean())) < 5 * 0.5 / np.sqrt(noise.size)
    assert float(noise.std()) == pytest.approx(secured.noise_std, rel=0.03)
    # the ledger: one release of the survivors' variance, in encoded units (2^21 per unit)
    variance, l1, l2 = secured.release  # type: ignore[misc]
    assert variance == pytest.approx((0.5 * 2**21) ** 2 * 4 / 5)
    assert l2 == pytest.approx(2**21 + np.sqrt(noise.size), rel=1e-9)
    row = read_jsonl(Path(cfg["out-dir"]) / "metrics.jsonl")[0]
    want = distributed_epsilon([(variance, l1, l2, 1.0, 1)], 1e-5)
    assert row["train"]["client-epsilon"] == pytest.approx(want)
    assert row["train"]["client-dp-noise-std"] == pytest.approx(secured.noise_std / 5)
    assert summary["privacy"]["client-level"]["mechanism"] == "distributed Skellam"


def test_over_selection_shares_the_noise_out_among_the_arrivals_the_sum_keeps(
    run_config: dict[str, Any], record: Record
) -> None:
    """Eight clients, q = 0.5 over-selected by half: sampled at 0.75, the sum keeps the first
    ceil(q N) = 4, each adding 1/4 of the noise, and the ledger accounts the release at rate 0.75
    with twice one client's sensitivity (one in, another pushed out)."""
    from models.privacy import distributed_epsilon

    summary, cfg = _run(run_config, record, clients=8, settings={
        **DISTRIBUTED, "fraction-train": 0.5, "round.over-selection": 0.5,
    })  # fmt: skip
    assert summary["status"] == "completed", summary.get("reason")
    ((_, _, payloads, _summed, secured),) = record.sums
    assert len(payloads) > 4 and len(secured.clients) == 4
    variance, l1, l2 = secured.release  # type: ignore[misc]
    assert variance == pytest.approx((0.5 * 2**21) ** 2)  # 4 shares of a quarter: all of it
    assert secured.noise_std == pytest.approx(0.5)
    row = read_jsonl(Path(cfg["out-dir"]) / "metrics.jsonl")[0]
    want = distributed_epsilon([(variance, 2 * l1, 2 * l2, 0.75, 1)], 1e-5)
    assert row["train"]["client-epsilon"] == pytest.approx(want)
    assert row["train"]["client-epsilon"] > distributed_epsilon([(variance, l1, l2, 0.5, 1)], 1e-5)


def test_fedsc_shares_dp_calr_s_noise_out_and_accounts_the_others_shares(
    run_config: dict[str, Any], record: Record
) -> None:
    """fedsc.noise-at=sum: the clients release their matrices un-noised into the secure sum,
    which carries sigma once (as integers shared out among them); each client's release is
    accounted with the noise of the others' shares."""
    from models.privacy import distributed_epsilon

    sigma = 0.05
    settings = {"fedsc.noise-std": sigma, "fedsc.noise-at": "sum", "fedsc.delta": 1e-3,
                "fedsc.dim": 32}  # fmt: skip
    summary, cfg = _run(run_config, record, "fedsc", clients=4, settings=settings)
    assert summary["status"] == "completed", summary.get("reason")
    correlation = [s for s in record.sums if s[1] == "query.correlation"]
    ((_, _, payloads, summed, secured),) = correlation
    assert summed.noise_std == sigma and secured.release is not None
    index = record.sums.index(correlation[0])
    replies = {c: record.clear[(index, c)] for c in secured.clients}
    assert all("epsilon" not in protocol.metrics_of(r) for r in replies.values())
    oracle = exact_sum(payloads, replies, summed, secured.weights)
    noise = (secured.sums["correlation"]["r"] - oracle.sums["correlation"]["r"]).ravel()
    # 32 x 32 entries (528 of them free in a symmetric matrix): the sample's std is within 15 %
    # of the noise's but for a 5-sigma draw; the noise of every client in full (sqrt(4) times
    # it) or of one alone (half) falls far outside
    assert noise.size == 32 * 32
    assert float(noise.std()) == pytest.approx(sigma * secured.weight_scale, rel=0.15)
    # the ledger: each client protected by the three others' shares of the variance
    variance = secured.release[0]
    row = read_jsonl(Path(cfg["out-dir"]) / "metrics.jsonl")[0]
    from strategies.fedsc import FedSC

    server = FedSC(cfg)  # its accounting, on the sizes the clients reported
    server.sizes = {c: protocol.as_int(protocol.metrics_of(r)["num-examples"])
                    for c, r in replies.items()}  # fmt: skip
    epsilons = []
    for cid in secured.clients:
        a = secured.weights[cid] / secured.weight_scale
        entry = server._release(cid, variance / 4 * 3, a)
        epsilons.append(distributed_epsilon([entry], 1e-3, amplified=False))
    assert row["train"]["epsilon"] == pytest.approx(max(epsilons), rel=1e-6)
    assert "DP-CalR, its noise shared out" in summary["privacy"]["correlations"]["mechanism"]


def test_a_sampled_round_sums_its_sample(run_config: dict[str, Any], record: Record) -> None:
    summary, cfg = _run(run_config, record, settings={"fraction-train": 0.6, "num-rounds": 2})
    assert summary["status"] == "completed", summary.get("reason")
    for *_, secured in record.sums:
        assert len(secured.clients) == 3  # ceil(0.6 x 5)
    keys = [m for m in record.received if m.metadata.message_type == contract.KEYS]
    assert len(keys) == 6
    assert _check_sums(record, cfg) == 2


def _in_order(clients: Any, k: int, seed: bytes) -> dict[int, frozenset[int]]:
    """The Harary graph over the clients in id order (patched in for the server and the
    clients alike: both draw the graph)."""
    from secagg import graph

    return graph.harary(sorted(clients), k)


@pytest.mark.slow
@pytest.mark.parametrize("check", [True, False])
def test_survivors_in_two_groups_with_no_neighbours_between_them_are_not_unmasked(
    run_config: dict[str, Any], record: Record, monkeypatch: pytest.MonkeyPatch, check: bool
) -> None:
    """22 clients, k = 10 on a ring in id order; clients 5-9 and 16-20 lost in the masked
    stage: every neighbourhood keeps its t = 6, but the survivors fall into {10..15} and
    {21, 0..4}, with no pairwise masks between them, so the unmasking would give each group's
    sum. The round stops before any share is revealed; with the check off it unmasks."""
    import server.secagg as server_secagg
    from secagg import graph

    components = graph.components
    monkeypatch.setattr(server_secagg.graph, "neighbours", _in_order)
    if not check:
        monkeypatch.setattr(server_secagg.graph, "components", lambda nb, members: [set(members)])
    lost = set(range(5, 10)) | set(range(16, 21))
    settings = {"secagg.degree": 10, "phase-timeout": 5.0, "min-replies": 2}
    summary, _ = _run(run_config, record, clients=22, faults=[_drop("train", lost)],
                      settings=settings)  # fmt: skip
    unmasks = [m for m in record.received if m.metadata.message_type == contract.UNMASK]
    if check:
        assert summary["status"] == "failed"
        assert "fall into 2 groups with no neighbours between them" in summary["reason"]
        assert unmasks == []  # no share was asked for
    else:
        assert summary["status"] == "completed", summary.get("reason")
        assert len(unmasks) == 12
        parts = components(graph.harary(list(range(22)), 10), set(range(22)) - lost)
        assert sorted(map(sorted, parts)) == [[0, 1, 2, 3, 4, 21], list(range(10, 16))]


@pytest.mark.parametrize("wait_for_neighbourhoods", [True, False])
def test_over_selection_closes_the_masked_stage_only_where_the_sum_can_be_unmasked(
    run_config: dict[str, Any],
    record: Record,
    monkeypatch: pytest.MonkeyPatch,
    wait_for_neighbourhoods: bool,
) -> None:
    """10 clients on a ring in id order (k = 4, t = 3), over-selected for 7 replies: the first
    7 (clients 0-6, all arriving at once, lower ids first) leave dropped client 7's masking key
    with 2 holders. The stage keeps the next replies until every secret keeps t holders (client
    7's: 8 in the sum); closed at the first 7 as before, the round would fail."""
    import server.exchange as exchange
    import server.secagg as server_secagg

    monkeypatch.setattr(server_secagg.graph, "neighbours", _in_order)
    if not wait_for_neighbourhoods:
        init = exchange.Phase.__init__

        def closing_at_target(self: Any, *args: Any, **kwargs: Any) -> None:
            init(self, *args, **{**kwargs, "enough": None})

        monkeypatch.setattr(exchange.Phase, "__init__", closing_at_target)
    summary, cfg = _run(run_config, record, clients=10, settings={
        "secagg.degree": 4, "fraction-train": 0.7, "round.over-selection": 0.43,
    })  # fmt: skip
    if wait_for_neighbourhoods:
        assert summary["status"] == "completed", summary.get("reason")
        ((_, _, payloads, _, secured),) = record.sums
        assert len(payloads) == 10 and secured.clients == list(range(8))
        assert _check_sums(record, cfg) == 1
    else:
        assert summary["status"] == "failed"
        assert "client 7's masks with its neighbours needs 3 shares and 2" in summary["reason"]


@pytest.mark.slow
def test_over_selection_with_secure_aggregation_completes_every_round_at_130_clients(
    run_config: dict[str, Any], record: Record
) -> None:
    """The run of `pollen simulate --clients 130 --set fraction-train=0.3 --set
    round.over-selection=0.3 --set secagg.enabled=true`: closed at its target alone, about one
    masked stage in seven left a dropped client's neighbourhood short and failed the run."""
    summary, cfg = _run({**run_config, "num-rounds": 8}, record, clients=130, settings={
        "num-rounds": 8, "fraction-train": 0.3, "round.over-selection": 0.3,
    })  # fmt: skip
    assert summary["status"] == "completed", summary.get("reason")
    rows = read_jsonl(Path(cfg["out-dir"]) / "metrics.jsonl")
    assert len(rows) == len(record.sums) == 8
    assert all(len(s.clients) >= 39 for *_, s in record.sums)  # the target, or more


def test_a_dropout_target_sizes_the_graph_the_server_and_the_clients_draw(
    run_config: dict[str, Any], record: Record
) -> None:
    """secagg.dropout=0.05 at 40 clients: k from Bell et al.'s condition (above the default
    2 ceil(log2 40) = 12), the same on both sides: every client seals a share for each of its k
    neighbours, and the sum is exact."""
    from pollen.core.protection import SecAggSettings
    from secagg import graph

    settings = {"secagg.dropout": 0.05}
    k, _ = SecAggSettings.of(settings_of({**run_config, **settings})).graph_for(40)
    assert k > graph.degree(40)
    summary, cfg = _run(run_config, record, clients=40, settings=settings)
    assert summary["status"] == "completed", summary.get("reason")
    shares = [m for m in record.received if m.metadata.message_type == contract.SHARES]
    assert len(shares) == 40
    for m in shares:
        sealed = contract.byte_strings(protocol.arrays_of(m.content, contract.BYTES))
        assert len(sealed) == k
    assert _check_sums(record, cfg) == 1
