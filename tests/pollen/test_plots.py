"""pollen report's plots: where a series places each value, and the plot of a partition."""

from __future__ import annotations

from pathlib import Path

from pollen.tools.plots import metric_series, plot_partition
from pollen.tools.runs import load_run
from tests.pollen.test_report import _svg_texts, assert_png, make_run


def test_local_tests_after_training_so_its_figures_stay_at_their_round(tmp_path: Path) -> None:
    """Local's clients test their personal model after the round's training (pollen.core.registry:
    evaluates_received=False): round r's figure describes model r, and the final evaluation
    (of the model after the last round) takes the last round's place, not a second point."""
    fedavg = load_run(make_run(tmp_path, "a", "fedavg", 0.5))
    local = load_run(make_run(tmp_path, "b", "local", 0.5))
    assert [x for x, _ in metric_series(fedavg, "accuracy")["clients test-accuracy"]] == [
        0, 1, 2, 3]  # fmt: skip
    placed = metric_series(local, "accuracy")["clients test-accuracy"]
    assert local.summary is not None and local.summary.final is not None
    final = local.summary.final.eval["test-accuracy"]
    assert placed == [(1, 0.55), (2, 0.60), (3, final)]
    assert [x for x, _ in metric_series(local, "loss")["clients train-loss"]] == [1, 2, 3]


def test_a_partition_plot_draws_every_client_and_label_count(tmp_path: Path) -> None:
    summary = {"clients": [
        {"client_id": 0, "train": 150, "train_labels": [100, 50, 0]},
        {"client_id": 1, "train": 80, "train_labels": [0, 20, 60]},
    ]}  # fmt: skip
    plot_partition(summary, tmp_path / "p.svg", "toy, 2 clients")
    texts = _svg_texts(tmp_path / "p.svg")
    assert "toy, 2 clients" in texts
    for count in ("100", "50", "20", "60"):  # every segment says its count
        assert count in texts
    assert {"0", "1", "2"} <= set(texts) and "label" in texts
    plot_partition(summary, tmp_path / "p.png")
    assert_png(tmp_path / "p.png")
