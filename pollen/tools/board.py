"""TensorBoard event files of a run, written as its results files grow (`--tensorboard DIR`).

A `Board` is a progress sink (pollen.tools.progress): the launcher follows the results directory and
hands it every round row (metrics.jsonl), client row (clients.jsonl) and, at the end, the
summary, so the ServerApp needs no TensorBoard and `pollen run` against a remote SuperLink works
the same. Tags and steps (docs/monitoring.md#tensorboard):

- `clients/<metric>`: the clients' aggregate of a round (mean; `-p10`, `-min` where the
  aggregation adds them), `server/<metric>`: the server's evaluation after the round,
  `round/seconds` and `round/MB` (sent + received);
- `per-client/<metric>`: a histogram of the clients' values in a round.

The step is the round whose aggregated model a figure describes (pollen.core.runconfig.model_round):
a client's test metrics of round r evaluate the model it received (after round r-1), so they
are written at step r-1 (Local's, which test after training, at r), and the final evaluation at
the last round, as `pollen report` places them.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from pollen.core.runconfig import model_round
from pollen.core.rundir import ClientRow, RoundRow, Summary

INSTALL_HINT = "pip install 'pollen[tensorboard]' (in a checkout: pip install -e '.[tensorboard]')"


def missing() -> str | None:
    """Why `--tensorboard` cannot write here, in one line (None: it can)."""
    if importlib.util.find_spec("tensorboard") is None:
        return f"--tensorboard needs the tensorboard package (not installed): {INSTALL_HINT}"
    return None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


class Board:
    """A TensorBoard SummaryWriter fed a run's rows as they arrive."""

    def __init__(self, log_dir: Path, num_rounds: int, algorithm: str) -> None:
        from torch.utils.tensorboard import SummaryWriter  # lazy: torch, only with --tensorboard

        self.log_dir = Path(log_dir)
        self.writer = SummaryWriter(log_dir=str(self.log_dir))
        self.num_rounds = num_rounds
        self.algorithm = algorithm
        self._clients: dict[int, dict[str, list[float]]] = {}  # round -> metric -> values
        self._written: set[tuple[str, int]] = set()  # (tag, step) of the clients' scalars

    def _step(self, key: str, rnd: int) -> int:
        if self.num_rounds and rnd > self.num_rounds:  # the final evaluation: model N
            return self.num_rounds
        return model_round(self.algorithm, key, rnd)

    def round(self, row: RoundRow) -> None:
        r = row.round
        for who, metrics in (("clients", row.train), ("server", row.server_eval or {})):
            for key, value in metrics.items():
                y = _number(value)
                if y is None or str(key).endswith("examples"):
                    continue
                step = self._step(str(key), r) if who == "clients" else r
                self.writer.add_scalar(f"{who}/{key}", y, step)
                self._written.add((f"{who}/{key}", step))
        self.writer.add_scalar("round/seconds", row.seconds, r)
        self.writer.add_scalar("round/MB", (row.bytes_sent + row.bytes_received) / 1e6, r)
        self._histograms(upto=r)
        self.writer.flush()

    def client(self, row: ClientRow) -> None:
        per_key = self._clients.setdefault(row.round, {})
        for key, value in row.metrics.items():
            y = _number(value)
            if y is not None and not str(key).endswith("examples"):
                per_key.setdefault(str(key), []).append(y)

    def _histograms(self, upto: int | None) -> None:
        import numpy as np  # lazy: numpy comes with torch here, only with --tensorboard

        for rnd in sorted(r for r in self._clients if upto is None or r <= upto):
            for key, values in sorted(self._clients.pop(rnd).items()):
                step = self._step(key, rnd)
                self.writer.add_histogram(f"per-client/{key}", np.asarray(values), step)

    def close(self, summary: Summary | None) -> None:
        """The final evaluation (from summary.json) at the last round where no round measured
        that model already (Local's), then the files closed."""
        rounds = summary.rounds if summary is not None else None
        last = rounds if rounds is not None else self.num_rounds
        final = summary.final if summary is not None else None
        if final is not None and last:
            for key, value in final.eval.items():
                y = _number(value)
                tag = f"clients/{key}"
                if y is None or not str(key).startswith("test-") or (tag, last) in self._written:
                    continue
                self.writer.add_scalar(tag, y, last)
        self._histograms(upto=None)
        self.writer.close()
