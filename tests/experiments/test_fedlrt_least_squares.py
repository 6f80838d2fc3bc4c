"""The paper's Figure 4 setting in experiments.fedlrt_least_squares: medians over initial
weights of the same runs models.least_squares makes, and the report built from them."""

from __future__ import annotations

import numpy as np
import pytest

from experiments.fedlrt_least_squares import figure4, figure4_report
from models.least_squares import (
    GramClient,
    homogeneous_problem,
    initial_factors,
    run_dense,
    run_fedlrt,
)


@pytest.mark.slow
def test_figure4_reports_the_median_over_initial_weights() -> None:
    result = figure4(clients=2, inits=3, rounds=2)
    data, target = homogeneous_problem(n=20, rank=4, points=10_000, clients=2, seed=0)
    clients = [GramClient.of(c) for c in data]  # as figure4 does for 5,000 points a client
    lrt, lin = [], []
    for init in range(3):
        start = initial_factors(20, 10, init)
        lrt.append(run_fedlrt(clients, start, "simplified", lr=1e-3, steps=20, rounds=2,
                              tau=0.1, target=target).distance)  # fmt: skip
        lin.append(run_dense(clients, start.dense(), lr=1e-3, steps=20, rounds=2,
                             corrected=True, target=target).loss)  # fmt: skip
    np.testing.assert_allclose(result["median"]["fedlrt"]["distance"], np.median(lrt, axis=0),
                               rtol=1e-9)  # fmt: skip
    np.testing.assert_allclose(result["median"]["fedlin"]["loss"], np.median(lin, axis=0),
                               rtol=1e-9)  # fmt: skip
    assert [r["init"] for r in result["runs"]] == [0, 1, 2]
    text = figure4_report([result])
    assert "\n| 2 | " in text and "none of 3" in text  # 2 rounds reach no 1e-5
