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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pollen.core.runconfig import model_round

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

    def round(self, row: Mapping[str, Any]) -> None:
        rnd = _number(row.get("round"))
        if rnd is None:
            return
        r = int(rnd)
        for section, who in (("train", "clients"), ("server-eval", "server")):
            metrics = row.get(section)
            for key, value in (metrics.items() if isinstance(metrics, Mapping) else ()):
                y = _number(value)
                if y is None or str(key).endswith("examples"):
                    continue
                step = self._step(str(key), r) if who == "clients" else r
                self.writer.add_scalar(f"{who}/{key}", y, step)
                self._written.add((f"{who}/{key}", step))
        seconds = _number(row.get("seconds"))
        if seconds is not None:
            self.writer.add_scalar("round/seconds", seconds, r)
        sent = [_number(row.get(k)) for k in ("bytes-sent", "bytes-received")]
        if any(v is not None for v in sent):
            self.writer.add_scalar("round/MB", sum(v or 0.0 for v in sent) / 1e6, r)
        self._histograms(upto=r)
        self.writer.flush()

    def client(self, row: Mapping[str, Any]) -> None:
        rnd = _number(row.get("round"))
        metrics = row.get("metrics")
        if rnd is None or not isinstance(metrics, Mapping):
            return
        per_key = self._clients.setdefault(int(rnd), {})
        for key, value in metrics.items():
            y = _number(value)
            if y is not None and not str(key).endswith("examples"):
                per_key.setdefault(str(key), []).append(y)

    def _histograms(self, upto: int | None) -> None:
        import numpy as np  # lazy: numpy comes with torch here, only with --tensorboard

        for rnd in sorted(r for r in self._clients if upto is None or r <= upto):
            for key, values in sorted(self._clients.pop(rnd).items()):
                step = self._step(key, rnd)
                self.writer.add_histogram(f"per-client/{key}", np.asarray(values), step)

    def close(self, summary: Mapping[str, Any] | None) -> None:
        """The final evaluation (from summary.json) at the last round where no round measured
        that model already (Local's), then the files closed."""
        final = summary.get("final") if isinstance(summary, Mapping) else None
        rounds = _number(summary.get("rounds")) if isinstance(summary, Mapping) else None
        last = int(rounds) if rounds is not None else self.num_rounds
        evaluation = final.get("eval") if isinstance(final, Mapping) else None
        if isinstance(evaluation, Mapping) and last:
            for key, value in evaluation.items():
                y = _number(value)
                tag = f"clients/{key}"
                if y is None or not str(key).startswith("test-") or (tag, last) in self._written:
                    continue
                self.writer.add_scalar(tag, y, last)
        self._histograms(upto=None)
        self.writer.close()
