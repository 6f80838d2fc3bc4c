"""What the `pollen` launcher (pollen.tools.processes starts Flower's processes) and the ServerApp
it starts (server.app) agree on without importing each other."""

LAUNCHER_PID = "POLLEN_LAUNCHER_PID"
"""Environment variable with the launcher's pid: the ServerApp exits once it is gone."""
