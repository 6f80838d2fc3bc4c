"""The pacing settings and the clients' devices (pollen.core.pacing): each profile's devices,
a device's time for a message, a CSV file's every defect in one line, and the settings that
refuse to go together."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from pollen.core.pacing import Device, devices, read_csv, reference
from pollen.core.runconfig import resolve
from pollen.core.settings import SettingsError


def test_a_devices_time_is_latency_link_and_compute() -> None:
    phone = Device(example_ms=4.0, bandwidth_mbps=8.0, latency_ms=50.0)
    # 2 x 50 ms, 1 MB down + 0.5 MB up at 8 Mbit/s = 1.5 s, 250 examples x 4 ms = 1 s
    assert phone.seconds(250, 1_000_000, 500_000) == pytest.approx(0.1 + 1.5 + 1.0)
    # on the wall clock only what the device adds to this machine's compute is waited out
    machine = Device(1.0, 1.0, 0.0)
    assert phone.extra_seconds(2.0, machine, 0, 0) == pytest.approx(3 * 2.0 + 0.1)
    assert machine.extra_seconds(2.0, phone, 0, 0) == 0.0  # a faster device is not faster here


def test_tiers_makes_exactly_the_slow_share_slowdown_times_slower() -> None:
    cfg = resolve({"num-clients": 100, "heterogeneity.profile": "tiers",
                   "heterogeneity.slowdown": 10.0, "heterogeneity.slow-fraction": 0.2})  # fmt: skip
    fleet = devices(cfg, 100, seed=3)
    slow = [d for d in fleet if d.example_ms > 5.0]
    assert len(fleet) == 100 and len(slow) == 20
    fast = reference(fleet)
    for d in slow:
        assert d.example_ms == pytest.approx(10 * fast.example_ms)
        assert d.bandwidth_mbps == pytest.approx(fast.bandwidth_mbps / 10)
        assert d.latency_ms == pytest.approx(10 * fast.latency_ms)
    assert devices(cfg, 100, seed=3) == fleet  # the server and a rerun agree
    assert devices(cfg, 100, seed=4) != fleet  # who is slow follows the seed


def test_lognormal_spreads_compute_around_example_ms() -> None:
    cfg = resolve({"heterogeneity.profile": "lognormal", "heterogeneity.example-ms": 5.0})
    ms = np.array([d.example_ms for d in devices(cfg, 4000, seed=0)])
    assert np.median(ms) == pytest.approx(5.0, rel=0.05)
    assert np.std(np.log(ms)) == pytest.approx(0.6, rel=0.05)


def test_phones_draw_compute_and_link_from_the_measured_percentiles() -> None:
    from pollen.core.device_data import BANDWIDTH_MBPS, PHONE_CPU_SCORES

    cfg = resolve({"heterogeneity.profile": "phones", "heterogeneity.example-ms": 5.0,
                   "heterogeneity.latency-ms": 30.0})  # fmt: skip
    fleet = devices(cfg, 20_000, seed=0)
    ms = np.array([d.example_ms for d in fleet])
    mbps = np.array([d.bandwidth_mbps for d in fleet])
    # a phone's time per example is example-ms times the median score over its score
    scores = PHONE_CPU_SCORES[50] * 5.0 / ms
    for q in (5, 25, 50, 75, 95):
        assert np.percentile(scores, q) == pytest.approx(PHONE_CPU_SCORES[q], rel=0.06)
        assert np.percentile(mbps, q) == pytest.approx(BANDWIDTH_MBPS["wifi"][q], rel=0.06)
    assert np.median(ms) == pytest.approx(5.0, rel=0.03)
    assert ms.min() >= 5.0 * PHONE_CPU_SCORES[50] / PHONE_CPU_SCORES[100]
    assert ms.max() <= 5.0 * PHONE_CPU_SCORES[50] / PHONE_CPU_SCORES[0]
    assert {d.latency_ms for d in fleet} == {30.0}
    # the network changes the links only; the seed, who is which
    cellular = devices(resolve({"heterogeneity.profile": "phones",
                                "heterogeneity.network": "4g"}), 20_000, seed=0)  # fmt: skip
    assert [d.example_ms for d in cellular] == pytest.approx(ms.tolist())
    cell = np.array([d.bandwidth_mbps for d in cellular])
    assert np.median(cell) == pytest.approx(BANDWIDTH_MBPS["4g"][50], rel=0.06)
    assert devices(cfg, 20_000, seed=0) == fleet
    assert devices(cfg, 100, seed=1) != fleet[:100]


def test_draw_is_the_quantile_function_between_the_percentiles() -> None:
    from pollen.core.pacing import draw

    table = tuple(10.0 ** (k / 50) for k in range(101))
    values = draw(table, np.random.default_rng(0), 50_000)
    assert values.min() >= 1.0 and values.max() <= 100.0
    # log-linear between percentiles of a log-uniform table: the draws are log-uniform
    assert np.histogram(np.log10(values), bins=4, range=(0, 2))[0] / 50_000 == pytest.approx(
        [0.25] * 4, abs=0.01
    )


def test_an_unknown_network_is_one_line() -> None:
    with pytest.raises(SettingsError) as err:
        resolve({"heterogeneity.profile": "phones", "heterogeneity.network": "3g"})
    assert "heterogeneity.network" in str(err.value) and "\n" not in str(err.value)


def test_a_devices_slowness_is_its_largest_ratio_to_the_typical_device() -> None:
    from pollen.core.pacing import slowness

    cfg = resolve({"num-clients": 10, "heterogeneity.profile": "tiers",
                   "heterogeneity.slowdown": 10.0, "heterogeneity.slow-fraction": 0.2})  # fmt: skip
    fleet = devices(cfg, 10, seed=0)
    assert sorted(slowness(fleet)) == pytest.approx([1.0] * 8 + [10.0] * 2)
    # the typical device is each resource's median (2 ms, 10 Mbit/s, 20 ms here): the ratio
    # to each, the largest, and never below 1 for a device faster than it
    mixed = [Device(2.0, 10.0, 20.0), Device(8.0, 40.0, 20.0), Device(2.0, 1.0, 100.0)]
    assert slowness(mixed) == pytest.approx([1.0, 4.0, 10.0])
    assert slowness([]) == []
    # measured phones: the median phone waits about as long as the typical reply, not the
    # hundreds of times its link is thinner than the fastest phone's
    phones = devices(resolve({"heterogeneity.profile": "phones"}), 1000, seed=0)
    ratios = slowness(phones)
    assert float(np.median(ratios)) < 3.0 and max(ratios) > 10.0


def test_no_profile_no_devices() -> None:
    assert devices(resolve({}), 10, seed=0) == []


def test_a_csv_serves_client_i_from_row_i_and_repeats(tmp_path: Path) -> None:
    path = tmp_path / "devices.csv"
    path.write_text("example-ms,bandwidth-mbps,latency-ms\n2,10,20\n8,1.5,100\n")
    cfg = resolve({"heterogeneity.profile": str(path)})
    fleet = devices(cfg, 5, seed=0)
    assert [d.example_ms for d in fleet] == [2.0, 8.0, 2.0, 8.0, 2.0]
    assert fleet[1] == Device(8.0, 1.5, 100.0)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (None, "cannot read it"),
        ("example-ms,bandwidth-mbps\n1,2\n", "no column latency-ms"),
        ("example-ms,bandwidth-mbps,latency-ms\n1,fast,2\n", "line 2 is not numbers"),
        ("example-ms,bandwidth-mbps,latency-ms\n1,0,2\n", "bandwidth-mbps > 0"),
        ("example-ms,bandwidth-mbps,latency-ms\n1,nan,2\n", "line 2"),
        ("example-ms,bandwidth-mbps,latency-ms\n", "no devices"),
        ("client,example-ms,bandwidth-mbps,latency-ms\n0,1,2,3\n2,1,2,3\n", "0, 1, ..., 1"),
        ("\x00\xff", "no column"),
    ],
)
def test_a_bad_csv_is_one_line_naming_the_file(tmp_path: Path, text: str | None, said: str) -> None:
    path = tmp_path / "devices.csv"
    if text is not None:
        path.write_text(text)
    with pytest.raises(SettingsError) as err:
        read_csv(path)
    message = str(err.value)
    assert said in message and str(path) in message and "\n" not in message


def test_a_profile_that_is_neither_built_in_nor_csv_is_refused() -> None:
    said = r"not one of none, tiers, lognormal, phones nor a \.csv"
    with pytest.raises(SettingsError, match=said):
        resolve({"heterogeneity.profile": "laptops"})


def test_over_selection_with_client_dp_is_accounted_at_twice_the_sensitivity() -> None:
    from models.privacy import epsilon
    from pollen.core.contracts import client_dp

    dp = {"algorithm": "fedavg", "client-dp.noise-multiplier": 2.0, "fraction-train": 0.5,
          "num-clients": 20, "num-rounds": 20}  # fmt: skip
    plain = client_dp.mechanism(resolve(dp))
    over = client_dp.mechanism(resolve({**dp, "round.over-selection": 0.3}))
    assert plain is not None and over is not None
    assert plain.ledger_entry(1) == (2.0, 0.5, 1)
    # sampled at 0.5 x 1.3, one client in and another out: z / 2 at 0.65
    assert over.ledger_entry(1) == pytest.approx((1.0, 0.65, 1))
    assert over.denominator == plain.denominator == 10  # the mean stays over m = q N
    spent = client_dp.planned_epsilon(over, 20)
    assert spent == pytest.approx(epsilon([(1.0, 0.65, 20)], 1e-5))
    assert spent > 2 * client_dp.planned_epsilon(plain, 20)
    # a target epsilon calibrates the noise to what over-selection spends
    target = {**dp, "client-dp.noise-multiplier": 0.0, "client-dp.target-epsilon": 8.0,
              "round.over-selection": 0.3}  # fmt: skip
    calibrated = client_dp.mechanism(resolve(target))
    assert calibrated is not None
    assert client_dp.planned_epsilon(calibrated, 20) == pytest.approx(8.0, abs=0.02)
    # a deadline drops clients by their own device's time only: the guarantee stands
    assert resolve({**dp, "round.deadline": 10.0})["round.deadline"] == 10.0
    # noise on each client: every client protects itself, whatever the sample
    local = {**dp, "client-dp.noise-at": "client", "round.over-selection": 0.3}
    mech = client_dp.mechanism(resolve(local))
    assert mech is not None and mech.ledger_entry(1) == (1.0, 1.0, 1)


def test_over_selection_with_the_noise_shared_out_is_accounted_likewise() -> None:
    from models.privacy import distributed_epsilon
    from pollen.core.contracts import client_dp

    shared = {"algorithm": "fedavg", "client-dp.noise-multiplier": 2.0, "fraction-train": 0.5,
              "num-clients": 20, "client-dp.noise-at": "client", "secagg.enabled": True,
              "num-rounds": 20}  # fmt: skip
    mech = client_dp.mechanism(resolve({**shared, "round.over-selection": 0.3}))
    assert mech is not None and mech.distributed
    unit = mech.unit
    assert mech.planned_release(20) == pytest.approx(
        ((2.0 * unit) ** 2, 2 * math.sqrt(2) * unit, 2 * unit, 0.65, 20)
    )
    assert mech.release(7.0, 3.0, 2.0) == pytest.approx((7.0, 6.0, 4.0, 0.65))
    target = {**shared, "client-dp.noise-multiplier": 0.0, "client-dp.target-epsilon": 8.0,
              "round.over-selection": 0.3}  # fmt: skip
    calibrated = client_dp.mechanism(resolve(target))
    assert calibrated is not None
    spent = distributed_epsilon([calibrated.planned_release(20)], 1e-5)
    assert 7.99 <= spent <= 8.0


def test_fedbuff_with_the_noise_on_the_server_is_accounted_per_version() -> None:
    from models.privacy import epsilon, noise_for_epsilon
    from pollen.core.contracts import client_dp

    dp = {"algorithm": "fedavg", "client-dp.noise-multiplier": 4.0, "fraction-train": 0.5,
          "num-clients": 20, "num-rounds": 20, "async.buffer": 5}  # fmt: skip
    cfg = resolve(dp)
    mech = client_dp.mechanism(cfg)
    assert mech is not None and mech.buffer == 5 and not client_dp.poisson_sampling(cfg)
    # no sample, one client's update replaced in each version: z / 2 at rate 1, every version
    assert mech.ledger_entry(1) == (2.0, 1.0, 1)
    assert mech.denominator == 5  # the noisy sum over the buffer's K
    assert client_dp.planned_epsilon(mech, 20) == pytest.approx(epsilon([(2.0, 1.0, 20)], 1e-5))
    target = {**dp, "client-dp.noise-multiplier": 0.0, "client-dp.target-epsilon": 8.0}
    calibrated = client_dp.mechanism(resolve(target))
    assert calibrated is not None
    assert calibrated.noise_multiplier == pytest.approx(2 * noise_for_epsilon(8.0, 1e-5, 1.0, 20))
    assert client_dp.planned_epsilon(calibrated, 20) == pytest.approx(8.0, abs=0.02)
    # synchronous rounds of the same settings sample: q = 0.5, sensitivity 1
    sync = client_dp.mechanism(resolve({**dp, "async.buffer": 0}))
    assert sync is not None and sync.ledger_entry(1) == (4.0, 0.5, 1) and sync.denominator == 10


def test_the_pacing_settings_have_their_fixed_names() -> None:
    cfg = resolve({})
    assert cfg["round.deadline"] == 0.0 and cfg["round.over-selection"] == 0.0
    assert cfg["heterogeneity.profile"] == "none" and cfg["heterogeneity.clock"] == "wall"
    assert not math.isnan(float(cfg["heterogeneity.example-ms"]))


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ({"algorithm": "fedlrt"}, "fedlrt refuses buffered asynchronous aggregation (FeDLRT's"),
        ({"algorithm": "scaffold"}, "scaffold refuses buffered asynchronous aggregation"),
        ({"algorithm": "fedsc"}, "fedsc refuses buffered"),
        ({"algorithm": "adept-ae"}, "adept-ae refuses buffered"),
        ({"round.deadline": 5.0}, "they pace synchronous rounds"),
        ({"secagg.enabled": True, "num-clients": 4}, "a buffer's clients are known only"),
        ({"algorithm": "fedem", "fedem.unseen-protocol": "one-step"}, "'converge'"),
        ({"num-clients": 3, "async.buffer": 4}, "exceeds the 3 clients that train"),
    ],
)
def test_what_buffered_aggregation_cannot_take_is_refused_in_one_line(
    extra: dict[str, object], said: str
) -> None:
    with pytest.raises(SettingsError) as err:
        resolve({"algorithm": "fedavg", "async.buffer": 2, "num-clients": 10, **extra})
    assert said in str(err.value) and "\n" not in str(err.value)


def test_buffered_aggregation_takes_fedavg_fedprox_fedavg_plus_fedem_and_client_dp() -> None:
    for algorithm in ("fedavg", "fedprox", "fedavg-plus", "fedem"):
        assert resolve({"algorithm": algorithm, "async.buffer": 3})["async.buffer"] == 3
    local = {"client-dp.noise-multiplier": 1.0, "client-dp.noise-at": "client"}
    assert resolve({"async.buffer": 3, **local})["async.buffer"] == 3
    # the noise on the server: no Poisson sample, so no minimum it would not honour
    server = {"client-dp.noise-multiplier": 1.0, "fraction-train": 0.3, "min-train-clients": 2}
    assert resolve({"async.buffer": 3, **server})["async.buffer"] == 3
    with pytest.raises(SettingsError, match="honours no minimum"):
        resolve(server)
    # every training client in each version: FedAvg's synchronous round (tests/server)
    assert resolve({"num-clients": 6, "async.buffer": 6})["async.buffer"] == 6
