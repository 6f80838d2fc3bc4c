"""The ServerApp: resolves the run's settings and hands the algorithm to the round engine."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from pollen.registry import get_algorithm
from pollen.settings import from_run_config
from server.blas import limit_blas_threads
from server.engine import Engine
from server.results import ResultsWriter

app = ServerApp()
log = logging.getLogger("flwr.pollen")


def exit_with_parent(
    getppid: Callable[[], int] = os.getppid,
    exit_: Callable[[int], None] = os._exit,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Exits once the process that started this one is gone. A `flwr-serverapp` whose SuperLink
    and SuperExec were killed otherwise lives on for minutes, retrying, and could write into
    the run directory while a resumed run uses it. Files are written atomically: a stop here
    leaves the last complete checkpoint."""
    parent = getppid()
    while getppid() == parent:
        sleep(2.0)
    log.error("the process that started this ServerApp (pid %s) is gone; exiting", parent)
    exit_(1)


@app.main()
def main(grid: Grid, context: Context) -> None:
    if os.path.basename(sys.argv[0]) == "flwr-serverapp":  # not when driven in-process
        threading.Thread(target=exit_with_parent, daemon=True).start()
    settings = from_run_config(context.run_config)
    limit_blas_threads(int(settings["server-blas-threads"]))
    out_dir = Path(str(settings["out-dir"]) or f"results/run-{context.run_id}")
    strategy = get_algorithm(str(settings["algorithm"])).strategy_class()(settings)
    Engine(grid, settings, strategy, ResultsWriter(out_dir)).run()
