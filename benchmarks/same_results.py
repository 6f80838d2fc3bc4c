"""Whether a change left the algorithms' results as they were: run every algorithm in process
(the real ServerApp and ClientApp over tests/fakes.FakeGrid, 4 clients, 2 rounds, seed 3) from
two checkouts and compare final models byte for byte and metrics without timing fields.

    PYTHONPATH=OLD_CHECKOUT .venv/bin/python benchmarks/same_results.py run /tmp/before
    PYTHONPATH=.            .venv/bin/python benchmarks/same_results.py run /tmp/after
    .venv/bin/python benchmarks/same_results.py compare /tmp/before /tmp/after
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

CASES: dict[str, dict[str, Any]] = {
    "fedavg": {},
    "fedprox": {},
    "fedavg-plus": {},
    "fedem": {},
    "d-fedem": {},
    "clustered": {},
    "scaffold": {},
    "local": {},
    "fedlrt": {},
    "fedlin": {},
    "adept-pca": {"dataset": "pca-synthetic", "partitioner": "natural", "adept.lr-sigma": 1e-5},
    "adept-ae": {},
    "fedsc": {"fedsc.dim": 8, "fedsc.passes": 1, "fedsc.views-per-pass": 1, "fedsc.knn-k": 20,
              "fedsc.probe-epochs": 3, "batch-size": 64},
}


def run(out: Path) -> None:
    from flwr.app import Context, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from client.app import app as client_app
    from pollen.core.runconfig import resolve
    from server.app import app as server_app
    from tests.fakes import FakeGrid

    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 1
    for algorithm, extra in CASES.items():
        run_dir = out / algorithm
        cfg = dict(
            resolve(
                {
                    "algorithm": algorithm, "dataset": "digits", "num-clients": 4,
                    "num-rounds": 2, "lr": 0.1, "batch-size": 16, "seed": 3,
                    "out-dir": str(run_dir), "cache-dir": str(out / "cache"),
                    "client-state-dir": str(run_dir / "state"), "run-name": algorithm, **extra,
                }
            )
        )  # fmt: skip
        server_app(FakeGrid(client_app, 4, cfg), Context(1, 0, {}, RecordDict(), cfg))
        print(algorithm, "done", flush=True)


def _strip(x: Any) -> Any:
    """x without its timing and memory fields."""
    if isinstance(x, dict):
        return {
            k: _strip(v)
            for k, v in x.items()
            if not ("seconds" in k or k.startswith("time") or "rss" in k)
        }
    if isinstance(x, list):
        return [_strip(v) for v in x]
    return x


def compare(a_root: Path, b_root: Path) -> bool:
    same = True
    for a in sorted(p for p in a_root.iterdir() if (p / "metrics.jsonl").exists()):
        b = b_root / a.name

        def rows(d: Path) -> list[Any]:
            return [
                _strip(json.loads(line)) for line in (d / "metrics.jsonl").read_text().splitlines()
            ]

        def final(d: Path) -> Any:
            return _strip(json.loads((d / "summary.json").read_text()).get("final"))

        model_a, model_b = a / "final_model.npz", b / "final_model.npz"
        model = (not model_a.exists() and not model_b.exists()) or (
            model_a.exists() and model_b.exists() and model_a.read_bytes() == model_b.read_bytes()
        )
        ok = rows(a) == rows(b) and final(a) == final(b) and model
        same &= ok
        print(f"{a.name:12s} {'same' if ok else 'DIFFERENT'}: metrics, final evaluation, model")
    return same


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "run":
        out = Path(argv[1])
        if out.exists() and any(out.iterdir()):  # a run appends to an earlier one's rows
            print(f"{out} is not empty: give a new directory", file=sys.stderr)
            return 2
        run(out)
        return 0
    if len(argv) == 3 and argv[0] == "compare":
        return 0 if compare(Path(argv[1]), Path(argv[2])) else 1
    print(__doc__)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
