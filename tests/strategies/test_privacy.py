"""The server's copy of the clients' DP-SGD ledgers (strategies.privacy.PrivacyLedger): the
steps it charges, its epsilon against Opacus' accountant for the same steps, the calibrated
noise, the checkpoint, and nothing at all without DP-SGD."""

from __future__ import annotations

import math

import pytest

from pollen.core.runconfig import resolve
from strategies.base import ClientInfo
from strategies.privacy import PrivacyLedger


def _client(cid: int, n: int) -> ClientInfo:
    return ClientInfo(cid=cid, node_id=100 + cid, num_train=n, num_val=0, num_test=0)


def test_charges_each_asked_client_a_round_of_poisson_steps() -> None:
    from opacus.accountants import RDPAccountant

    settings = resolve({"dp.noise-multiplier": 1.1, "batch-size": 32, "local-epochs": 2})
    ledger = PrivacyLedger(settings)
    for _ in range(3):
        ledger.charge([_client(0, 1000), _client(1, 100)])
    ledger.charge([_client(1, 100)])  # client 1 sampled once more
    # ceil(1000 / 32) = 32 steps an epoch at q = 1/32; ceil(100 / 32) = 4 at q = 1/4
    assert ledger.ledgers == {0: [(1.1, 1 / 32, 3 * 2 * 32)], 1: [(1.1, 1 / 4, 4 * 2 * 4)]}
    for cid, q in ((0, 1 / 32), (1, 1 / 4)):
        accountant = RDPAccountant()
        accountant.history = [(1.1, q, ledger.steps(cid))]
        assert ledger.epsilon(cid) == pytest.approx(accountant.get_epsilon(1e-5), rel=1e-12)
    metrics = ledger.metrics()
    assert metrics["epsilon"] == max(ledger.epsilon(0), ledger.epsilon(1))
    assert metrics["dp-steps-max"] == 192.0


def test_fedem_components_each_spend_privacy() -> None:
    settings = resolve({"dp.noise-multiplier": 1.0, "batch-size": 10})
    one, three = PrivacyLedger(settings), PrivacyLedger(settings, passes=3)
    one.charge([_client(0, 95)])
    three.charge([_client(0, 95)])
    assert three.steps(0) == 3 * one.steps(0) == 30


@pytest.mark.filterwarnings("ignore:Optimal order is the largest alpha")
def test_target_epsilon_is_reached_after_the_planned_rounds() -> None:
    settings = resolve({"dp.target-epsilon": 2.0, "num-rounds": 4, "batch-size": 16})
    ledger = PrivacyLedger(settings)
    for _ in range(4):
        ledger.charge([_client(0, 421)])
    assert 1.99 <= ledger.epsilon(0) <= 2.0
    # resumed for 6 rounds: the new rounds' noise is calibrated for 6, the first 4 keep theirs
    (z4, q, _), = ledger.ledgers[0]
    longer = PrivacyLedger({**settings, "num-rounds": 6})
    longer.load_state(ledger.state())
    longer.charge([_client(0, 421)])
    (_, _, _), (z6, q6, steps) = longer.ledgers[0]
    assert z6 > z4 and q6 == q and steps == 27
    assert longer.epsilon(0) > ledger.epsilon(0)


def test_the_ledger_round_trips_through_the_checkpoint_meta() -> None:
    settings = resolve({"dp.noise-multiplier": 0.9})
    ledger = PrivacyLedger(settings)
    ledger.charge([_client(0, 50), _client(3, 70)])
    again = PrivacyLedger(settings)
    again.load_state(ledger.state())
    assert again.ledgers == ledger.ledgers and again.metrics() == ledger.metrics()


def test_without_dp_sgd_it_is_silent() -> None:
    ledger = PrivacyLedger(resolve({}))
    ledger.charge([_client(0, 50)])
    assert ledger.metrics() == {} and ledger.state() == {} and ledger.ledgers == {}


def test_a_client_without_examples_spends_nothing() -> None:
    ledger = PrivacyLedger(resolve({"dp.target-epsilon": 1.0}))
    ledger.charge([_client(0, 0)])  # a client without examples takes no step
    assert ledger.epsilon(0) == 0.0 and not math.isinf(ledger.metrics()["epsilon"])


def test_against_the_server_distributed_noise_is_accounted_as_the_noise_on_each_client() -> None:
    """One convention against the server, which knows whom it asked: a neighbouring federation
    replaces one client's data (sensitivity 2C), for the noise shared out in a secure sum as
    for the noise on each client; against the readers of the models (sampled, add/remove) C.
    At the same z and rounds the two epsilons against the server agree (the Skellam noise of
    these variances is the Gaussian's to 1e-3), and the add/remove figure is well below."""
    from models.privacy import distributed_epsilon, epsilon
    from secagg import encoding
    from strategies.base import Secured

    base = {"num-clients": 10, "fraction-train": 0.5, "client-dp.noise-multiplier": 1.0,
            "client-dp.clip": 1.0, "client-dp.noise-at": "client"}  # fmt: skip
    ledger = PrivacyLedger(resolve({**base, "secagg.enabled": True}))
    enc = encoding.Encoding(1.0, 22, 32)
    l2 = encoding.rounded_l2_bound(1.0, 100, enc)
    release = ((1.0 * enc.scale) ** 2, 10 * l2, l2)
    for _ in range(5):
        ledger.secured(Secured({}, {}, 1.0, release=release))
    vs_server = ledger.metrics()["client-epsilon-vs-server"]
    local = PrivacyLedger(resolve(base)).client_level
    assert local is not None and local.local
    assert vs_server == pytest.approx(epsilon([local.ledger_entry(5)], 1e-5), rel=0.01)
    add_remove = distributed_epsilon([(*release, 1.0, 5)], 1e-5, amplified=False)
    assert vs_server > 2 * add_remove
