"""The ServerApp: resolves the run's settings and hands the algorithm to the round engine."""

from __future__ import annotations

from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from pollen.core.registry import get_algorithm
from pollen.core.runconfig import from_run_config
from pollen.core.settings import RunSettings
from server.blas import limit_blas_threads
from server.engine import Engine
from server.lifeline import watch_parent
from server.results import ResultsWriter
from strategies.base import strategy_class

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    watch_parent()
    settings = from_run_config(context.run_config)
    run = RunSettings.of(settings)
    limit_blas_threads(run.server_blas_threads)
    out_dir = Path(run.out_dir or f"results/run-{context.run_id}")
    strategy = strategy_class(get_algorithm(run.algorithm))(settings)
    Engine(grid, settings, strategy, ResultsWriter(out_dir)).run()
