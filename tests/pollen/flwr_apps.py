"""Running a Flower project as its user does: `flwr run` of the project directory on a
simulation SuperLink started for the test (pollen.tools.local_federation), and its ServerApp's
log once the run has finished."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pollen.core.settings import Scalar
from pollen.tools.local_federation import LocalFederation


def flwr_run(
    app: Path, work: Path, cache: Path, clients: int, config: Mapping[str, Scalar]
) -> str:
    """The ServerApp's log of `flwr run APP` with the run config `config` on `clients`
    simulated SuperNodes; the run must finish as completed (`flwr run` exits 0 either way)."""
    fed = LocalFederation(work)
    fed.env.update(RAY_ADDRESS="local", POLLEN_CACHE_DIR=str(cache), FLWR_TELEMETRY_ENABLED="0")
    try:
        fed.start_superlink(simulation=True)
        fed.configure_simulation(clients, 1)
        run_id = fed.submit(config, app=app)
        deadline = time.monotonic() + 600
        status: dict[str, Any] = {}
        while time.monotonic() < deadline:
            status = fed.run_status(run_id)
            if str(status.get("status", "")).startswith("finished"):
                break
            time.sleep(2)
        log = fed.server_log(run_id)
        assert status.get("status") == "finished:completed", (status, log[-3000:])
    finally:
        fed.stop()
    return log
