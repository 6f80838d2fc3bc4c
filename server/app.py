"""The ServerApp: resolves the run's settings and hands the algorithm to the round engine."""

from __future__ import annotations

from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from pollen.registry import get_algorithm
from pollen.settings import from_run_config
from server.engine import Engine
from server.results import ResultsWriter

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    settings = from_run_config(context.run_config)
    out_dir = Path(str(settings["out-dir"]) or f"results/run-{context.run_id}")
    strategy = get_algorithm(str(settings["algorithm"])).strategy_class()(settings)
    Engine(grid, settings, strategy, ResultsWriter(out_dir)).run()
