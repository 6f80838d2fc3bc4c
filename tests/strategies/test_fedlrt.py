"""FeDLRT and FedLin on the engine, in-process (digits, an MLP whose hidden layers are
low-rank): phases and traffic, ranks, orthonormal bases, rejected replies, resume state."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import Message, RecordDict

from client.app import app as client_app
from models.fedlrt import orthonormality_error
from pollen import protocol
from server.engine import Engine
from server.results import ResultsWriter, read_jsonl
from strategies.base import Strategy
from strategies.fedlrt import FedLin, FeDLRT
from tests.fakes import FakeClock, FakeGrid, settings_of


def _run(cfg: dict[str, Any], strategy: Strategy, nodes: int = 3) -> FakeGrid:
    grid = FakeGrid(client_app, nodes, cfg)
    clock = FakeClock()
    Engine(grid, cfg, strategy, ResultsWriter(cfg["out-dir"]), clock=clock, sleep=clock.sleep).run()
    return grid


def _cfg(run_config: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return settings_of({**run_config, "algorithm": "fedlrt", "lr": 0.1, **extra})


@pytest.mark.parametrize("var_cor", ["none", "simplified", "full"])
def test_fedlrt_trains_low_rank_layers_with_two_or_three_phases(
    run_config: dict[str, Any], var_cor: str
) -> None:
    cfg = _cfg(run_config, **{"fedlrt.var-cor": var_cor, "fedlrt.tau": 0.05, "fedlrt.max-rank": 16,
                              "out-dir": f"{run_config['out-dir']}-{var_cor}"})  # fmt: skip
    strategy = FeDLRT(cfg)
    grid = _run(cfg, strategy)
    phases = [
        "query.fedlrt_basis",
        *(["query.fedlrt_coef_grad"] if var_cor == "full" else []),
        "train.fedlrt_coef",
    ]
    sent = [t for n, t in grid.sent if n == 100 and t != "query.hello"]
    assert sent == phases * 3 + ["evaluate"]
    assert sorted(strategy.factors) == ["net.1", "net.3"]  # the output layer stays dense
    rows = read_jsonl(Path(cfg["out-dir"]) / "metrics.jsonl")
    for row in rows:
        train = row["train"]
        assert [p["phase"] for p in row["phases"]] == phases
        assert 1 <= train["rank-net.1"] <= 16 and 1 <= train["rank-net.3"] <= 16
        assert train["orthonormality-error"] < 1e-10
        for name in ("net.1", "net.3"):  # truncation error < ϑ unless the rank cap cut deeper
            assert train[f"truncation-ratio-{name}"] < 1.0 or train[f"rank-{name}"] == 16
        # the measured payloads are round_floats' counts plus array headers
        assert train["bytes-formula"] <= train["bytes-per-client"] < 1.05 * train["bytes-formula"]
        assert train["bytes-per-client"] < 0.5 * train["bytes-fedavg"]
    for fac in strategy.factors.values():
        assert orthonormality_error(fac.U) < 1e-10 and orthonormality_error(fac.V) < 1e-10
        assert (np.diff(fac.s) <= 0).all() and (fac.s > 0).all()
    summary = json.loads((Path(cfg["out-dir"]) / "summary.json").read_text())
    assert summary["final"]["eval"]["test-accuracy"] > rows[0]["train"]["test-accuracy"] + 0.3
    assert summary["final"]["server-eval"]["test-loss"] < rows[0]["train"]["test-loss"] - 0.5


def test_a_reply_of_the_wrong_rank_is_rejected_and_the_round_goes_on(
    run_config: dict[str, Any],
) -> None:
    cfg = _cfg(run_config, **{"fedlrt.rank": 6, "num-rounds": 2, "final-eval": False})
    strategy = FeDLRT(cfg)
    grid = FakeGrid(client_app, 3, cfg)

    def wrong_rank(node: int, msg: Message, _reply: RecordDict | None) -> Any:
        if node != 101 or msg.metadata.message_type != "train.fedlrt_coef":
            return None

        def shrink(content: RecordDict) -> RecordDict:
            arrays = protocol.arrays_of(content)
            arrays["net.1.S"] = arrays["net.1.S"][:-1, :-1]
            content[protocol.ARRAYS] = protocol.to_record(arrays)
            return content

        return shrink

    grid.faults.append(wrong_rank)
    clock = FakeClock()
    Engine(grid, cfg, strategy, ResultsWriter(cfg["out-dir"]), clock=clock, sleep=clock.sleep).run()
    rows = read_jsonl(Path(cfg["out-dir"]) / "metrics.jsonl")
    for row in rows:
        # its correction went out, so the coefficient phases are redone with the other two
        first, again = row["phases"][-2:]
        assert first["phase"] == again["phase"] == "train.fedlrt_coef"
        assert first["valid"] == 2 and "net.1.S has shape" in first["failed"]["1"]
        assert again["valid"] == 2 and not again.get("failed")
        assert row["train"]["clients"] == 2.0 and row["train"]["restarts"] == 1.0


def test_state_round_trips_and_fedlin_corrects_the_whole_model(
    run_config: dict[str, Any],
) -> None:
    cfg = _cfg(run_config, **{"num-rounds": 1, "final-eval": False, "fedlrt.rank": 5})
    first = FeDLRT(cfg)
    _run(cfg, first)
    arrays, meta = first.state()
    again = FeDLRT(cfg)
    again.load_state(arrays, json.loads(json.dumps(meta)))
    for k, v in first.global_arrays().items():
        np.testing.assert_array_equal(again.global_arrays()[k], v)
    assert arrays["net.1.U"].dtype == np.float64

    lin_cfg = settings_of({**run_config, "algorithm": "fedlin", "lr": 0.05,
                           "out-dir": run_config["out-dir"] + "-fedlin"})  # fmt: skip
    fedlin = FedLin(lin_cfg)
    grid = _run(lin_cfg, fedlin)
    assert not fedlin.factors and "net.1.weight" in fedlin.dense
    assert [t for n, t in grid.sent if n == 100][1:3] == ["query.fedlin_grad", "train.fedlin"]
    rows = read_jsonl(Path(lin_cfg["out-dir"]) / "metrics.jsonl")
    assert rows[-1]["train"]["test-accuracy"] > 0.6
    # the correction doubles FedAvg's traffic
    assert rows[0]["train"]["bytes-formula"] == rows[0]["train"]["bytes-fedlin"]


@pytest.mark.parametrize("var_cor", ["simplified", "full"])
def test_a_client_lost_after_its_correction_restarts_the_round_without_it(
    run_config: dict[str, Any], var_cor: str
) -> None:
    """Corrections sum to zero only over the clients averaged: losing one in the train phase
    must give exactly the round in which it had never been sampled."""

    def one_round(lost_in: str) -> tuple[FeDLRT, FakeGrid, dict[str, Any]]:
        tag = f"{var_cor}-{lost_in}"
        cfg = _cfg(run_config, **{"fedlrt.var-cor": var_cor, "fedlrt.rank": 6, "num-rounds": 1,
                                  "final-eval": False, "run-name": tag,
                                  "out-dir": f"{run_config['out-dir']}-{tag}"})  # fmt: skip
        strategy = FeDLRT(cfg)
        grid = FakeGrid(client_app, 3, cfg)
        grid.faults.append(
            lambda node, msg, _r: (
                "drop" if node == 101 and msg.metadata.message_type == lost_in else None
            )
        )
        clock = FakeClock()
        Engine(grid, cfg, strategy, ResultsWriter(cfg["out-dir"]), clock=clock,
               sleep=clock.sleep).run()  # fmt: skip
        return strategy, grid, read_jsonl(Path(cfg["out-dir"]) / "metrics.jsonl")[0]

    late, grid, row = one_round("train.fedlrt_coef")
    never, _, never_row = one_round("query.fedlrt_basis")
    assert row["train"]["restarts"] == 1 and never_row["train"]["restarts"] == 0
    coef = ["query.fedlrt_coef_grad"] if var_cor == "full" else []
    assert [t for n, t in grid.sent if n == 100][1:] == (
        ["query.fedlrt_basis", *coef, "train.fedlrt_coef", *coef, "train.fedlrt_coef"]
    )
    assert [t for n, t in grid.sent if n == 101][-1] == "train.fedlrt_coef"  # sent once only
    assert row["train"]["clients"] == never_row["train"]["clients"] == 2.0
    for name, fac in never.factors.items():
        assert late.factors[name].rank == fac.rank
        for part in ("U", "s", "V"):
            np.testing.assert_allclose(
                getattr(late.factors[name], part), getattr(fac, part), rtol=0, atol=1e-10
            )
    for key, value in never.dense.items():
        np.testing.assert_allclose(late.dense[key], value, rtol=0, atol=1e-10)


@pytest.mark.parametrize(("algorithm", "phase"), [("fedlrt", "query.fedlrt_basis"),
                                                  ("fedlin", "query.fedlin_grad")])  # fmt: skip
def test_a_warm_start_trains_the_dense_start_on_the_first_client_once(
    run_config: dict[str, Any], algorithm: str, phase: str
) -> None:
    """The paper's ResNet-18 runs start from 5 iterations on one client (§4.2): client 0 alone
    gets the dense initial model before round 1's first phase, and the server's round-1 model is
    its reply, factorized; a resumed run does not warm-start again."""
    out = f"{run_config['out-dir']}-warm-{algorithm}"
    cfg = settings_of({**run_config, "algorithm": algorithm, "lr": 0.1, "num-rounds": 1,
                       "final-eval": False, "fedlrt.rank": 6, "fedlrt.warm-start": 3,
                       "out-dir": out, "run-name": f"warm-{algorithm}"})  # fmt: skip
    strategy = FeDLRT(cfg) if algorithm == "fedlrt" else FedLin(cfg)
    grid = FakeGrid(client_app, 3, cfg)
    warm_reply: dict[str, np.ndarray] = {}
    basis_sent: dict[str, np.ndarray] = {}

    def record(node: int, msg: Message, _reply: RecordDict | None) -> Any:
        kind = msg.metadata.message_type
        if kind == phase and node == 100:
            basis_sent.update(protocol.arrays_of(msg.content))
        if kind != "train.fedlrt_warm_start":
            return None

        def keep(content: RecordDict) -> RecordDict:
            warm_reply.update(protocol.arrays_of(content))
            return content

        return keep

    grid.faults.append(record)
    clock = FakeClock()
    Engine(grid, cfg, strategy, ResultsWriter(out), clock=clock, sleep=clock.sleep).run()
    assert [t for n, t in grid.sent if t == "train.fedlrt_warm_start"] == [
        "train.fedlrt_warm_start"
    ]
    assert [t for n, t in grid.sent if n == 100][:3] == ["query.hello", "train.fedlrt_warm_start",
                                                          phase]  # fmt: skip
    row = read_jsonl(Path(out) / "metrics.jsonl")[0]["train"]
    assert row["warm-start-client"] == 0.0 and row["warm-start-steps"] == 3.0
    assert np.isfinite(row["warm-start-train-loss"])
    # the first round starts from the client's reply (factorized for FeDLRT), not the init
    expected = FeDLRT(cfg) if algorithm == "fedlrt" else FedLin(cfg)
    expected.initialize(cfg["seed"])
    init = expected.global_arrays()
    expected._start_from(warm_reply)
    for key, value in expected.global_arrays().items():
        np.testing.assert_allclose(basis_sent[key], value, rtol=0, atol=1e-6)
    assert any(not np.allclose(init[k], warm_reply[k]) for k in warm_reply if k in init)

    resumed = settings_of({**cfg, "num-rounds": 2, "resume": True})
    grid = FakeGrid(client_app, 3, resumed)
    again = FeDLRT(resumed) if algorithm == "fedlrt" else FedLin(resumed)
    Engine(grid, resumed, again, ResultsWriter(out), clock=clock, sleep=clock.sleep).run()
    assert "train.fedlrt_warm_start" not in [t for _, t in grid.sent]
    assert read_jsonl(Path(out) / "metrics.jsonl")[-1]["round"] == 2


def test_warm_start_steps_are_minibatch_sgd_steps_across_passes() -> None:
    """`steps` updates on batches of the shuffled data, a new pass when one runs out: the same
    trajectory as torch.optim.SGD on those batches."""
    from client.common import Tensors
    from client.fedlrt import sgd_steps
    from client.training import SGD, batches

    torch.manual_seed(0)
    x, y = torch.randn(5, 3), torch.randint(0, 2, (5,))
    ours, ref = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    ref.load_state_dict(ours.state_dict())
    opt = SGD(list(ours.parameters()), 0.1, 0.9, 1e-3)
    loss = sgd_steps(ours, Tensors(x, y), 4, opt, 2, torch.Generator().manual_seed(7))
    gen = torch.Generator().manual_seed(7)
    order = [*batches(5, 2, gen), *batches(5, 2, gen)][:4]
    assert [len(i) for i in order] == [2, 2, 1, 2]
    torch_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    losses = []
    for idx in order:
        torch_opt.zero_grad()
        step = torch.nn.functional.cross_entropy(ref(x[idx]), y[idx])
        step.backward()  # type: ignore[no-untyped-call]
        torch_opt.step()
        losses.append(float(step.detach()))
    for a, b in zip(ours.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(a, b)
    assert loss == pytest.approx(sum(losses) / 4)


@pytest.mark.parametrize("algorithm", ["fedlrt", "fedlin", "fedavg"])
def test_local_work_counted_in_steps_takes_that_many_steps(
    run_config: dict[str, Any], monkeypatch: pytest.MonkeyPatch, algorithm: str
) -> None:
    """The paper's budget of s* local iterations (`local-steps`) reaches each method's local
    loop: every client takes exactly s* mini-batch steps a round, whatever local-epochs says."""
    from client.training import SGD
    from strategies.fedavg import FedAvg

    taken = 0
    step = SGD.step

    def counted(self: SGD) -> None:
        nonlocal taken
        taken += 1
        step(self)

    monkeypatch.setattr(SGD, "step", counted)
    cfg = _cfg(run_config, **{"algorithm": algorithm, "num-rounds": 2, "local-epochs": 2,
                              "local-steps": 5, "final-eval": False})  # fmt: skip
    strategy: Strategy = {"fedlrt": FeDLRT, "fedlin": FedLin, "fedavg": FedAvg}[algorithm](cfg)
    _run(cfg, strategy)
    assert taken == 5 * 3 * 2  # s* steps x 3 clients x 2 rounds
