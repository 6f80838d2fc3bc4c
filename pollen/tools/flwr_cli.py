"""The `flwr` CLI, run from a private FLWR_HOME: the connection to a SuperLink (started here
or elsewhere), its SuperNodes, and the runs submitted to it (submit, status, log, stop)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pollen.core.settings import Scalar, toml_value
from pollen.tools.processes import PROJECT_DIR, FlowerHome, LaunchError, bin_path

FLWR_TIMED_OUT = 124
"""Exit code `FlwrCli.flwr` gives a CLI call that did not answer in time (as timeout(1))."""


def app_dir() -> Path:
    if not (PROJECT_DIR / "pyproject.toml").exists():
        raise LaunchError(
            f"no pyproject.toml in {PROJECT_DIR}: run Pollen from its source checkout "
            "(pip install -e .), which is also what Flower bundles as the app"
        )
    return PROJECT_DIR


def run_configtoml_value(settings: Mapping[str, Scalar]) -> str:
    return "".join(f"{key} = {toml_value(value)}\n" for key, value in settings.items())


@dataclass
class FlwrCli(FlowerHome):
    """`flwr` commands against the SuperLink named in FLWR_HOME's config (`write_connection`)."""

    connection: str = "pollen"
    signing_key: Path | None = None
    """The operator's private key: every app submitted is signed with it (pollen.tools.signing)."""

    def write_connection(self, address: str, ca_cert: Path | None) -> None:
        lines = [
            "[superlink]",
            f'default = "{self.connection}"',
            "",
            f"[superlink.{self.connection}]",
            f'address = "{address}"',
        ]
        if ca_cert is None:
            lines.append("insecure = true")
        else:
            lines.append(f'root-certificates = "{Path(ca_cert).resolve()}"')
        (self.home / "config.toml").write_text("\n".join(lines) + "\n")

    def flwr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """`flwr ARGS`. A call that does not answer within `timeout` (a busy machine) returns
        exit code FLWR_TIMED_OUT with empty output, which every caller already reads as "no
        answer yet" or a failure, instead of raising through the launcher."""
        argv = [bin_path("flwr"), *args]
        try:
            return subprocess.run(
                argv,
                env=self.env,
                capture_output=True,
                text=True,
                timeout=timeout,
                cwd=self.workdir,
                check=False,
            )
        except subprocess.TimeoutExpired:
            reason = f"`flwr {' '.join(args[:2])}` did not answer within {timeout:g} s\n"
            return subprocess.CompletedProcess(argv, FLWR_TIMED_OUT, "", reason)

    def nodes(self) -> list[dict[str, Any]]:
        """The SuperLink's SuperNodes (`flwr supernode ls`): node-id, status, ..."""
        out = self.flwr("supernode", "ls", self.connection, "--format", "json")
        try:
            return list(json.loads(out.stdout).get("nodes", []))
        except json.JSONDecodeError:
            return []

    def wait_reachable(self, address: str, timeout: float = 120, every: float = 10) -> None:
        """Until the SuperLink at `address` answers the flwr CLI (`pollen run` may start before
        it does), saying every `every` seconds what it waits for."""
        start = time.monotonic()
        said = start
        while True:
            out = self.flwr("supernode", "ls", self.connection, "--format", "json", timeout=60)
            try:
                if json.loads(out.stdout).get("success"):
                    return
            except json.JSONDecodeError:
                pass
            waited = time.monotonic() - start
            if waited > timeout:
                raise LaunchError(
                    f"no SuperLink answers at {address} after {timeout:g} s: is `pollen server` "
                    "running there, is this its HTTP API port (--port, not the Fleet port), and "
                    "do --root-certificates match its TLS (none for --insecure)?"
                )
            if time.monotonic() - said >= every:
                said = time.monotonic()
                print(f"waiting for the SuperLink at {address}: {waited:.0f} s", flush=True)
            time.sleep(2.0)

    def online_nodes(self) -> int:
        return sum(1 for n in self.nodes() if n.get("status") == "online")

    def configure_simulation(
        self,
        num_supernodes: int,
        cpus_per_client: int,
        gpus_per_client: float = 0.0,
        num_gpus: int | None = None,
    ) -> None:
        """Simulated SuperNodes and the resources each ClientApp reserves in Ray, for runs on
        this (simulation) SuperLink: `cpus_per_client` CPUs and `gpus_per_client` of a GPU (a
        fraction shares one GPU between clients; Ray hides every GPU from a client that
        reserves none). `num_gpus`: the GPUs the Ray instance Flower starts offers (Ray's
        `num_gpus` of `ray.init`); None lets Ray detect them, and must be None when Flower
        joins an existing cluster (RAY_ADDRESS), whose nodes declare their own."""
        args = [
            "--num-supernodes",
            str(num_supernodes),
            "--client-resources-num-cpus",
            str(cpus_per_client),
        ]
        if gpus_per_client > 0:
            args += ["--client-resources-num-gpus", f"{gpus_per_client:g}"]
        if num_gpus is not None:
            args += ["--init-args-num-gpus", str(num_gpus)]
        done = self.flwr("federation", "simulation-config", "@none/default", self.connection, *args)
        if done.returncode != 0:
            raise LaunchError(f"could not configure the simulation:\n{done.stdout}{done.stderr}")

    def submit(
        self,
        settings: Mapping[str, Scalar],
        federation_config: Mapping[str, Scalar] | None = None,
        app: Path | None = None,
    ) -> str:
        """Start a run of the app in `app` (default: Pollen's own, this checkout), signed with
        `signing_key` when there is one."""
        config_file = self.workdir / "run-config.toml"
        config_file.write_text(run_configtoml_value(settings))
        bundle = app or app_dir()
        if self.signing_key is not None:
            from pollen.tools.signing import (  # lazy: cryptography
                SigningError,
                load_private_key,
                stage_signed_app,
            )

            try:
                key = load_private_key(self.signing_key)
                bundle = stage_signed_app(bundle, self.workdir / "signed-app", key)
            except (SigningError, ValueError) as exc:
                raise LaunchError(f"could not sign the app: {exc}") from None
        args = [
            "run",
            str(bundle),
            self.connection,
            "--run-config",
            str(config_file),
            "--format",
            "json",
        ]
        if federation_config:
            args += [
                "--federation-config",
                " ".join(f"{k}={toml_value(v)}" for k, v in federation_config.items()),
            ]
        out = self.flwr(*args, timeout=300)
        try:
            reply = json.loads(out.stdout)
        except json.JSONDecodeError:
            reply = {}
        if out.returncode != 0 or not reply.get("success") or "run-id" not in reply:
            raise LaunchError(f"flwr run failed:\n{out.stdout}\n{out.stderr}")
        return str(reply["run-id"])

    def run_status(self, run_id: str) -> dict[str, Any]:
        """The run's record from `flwr ls`; empty when unknown for now (no answer in time on a
        loaded machine, or unreadable output): the caller asks again, the run goes on."""
        out = self.flwr("ls", self.connection, "--run-id", run_id, "--format", "json")
        try:
            runs = json.loads(out.stdout).get("runs", [])
        except json.JSONDecodeError:
            return {}
        return dict(runs[0]) if runs else {}

    def stop_run(self, run_id: str) -> None:
        """Best effort: a SuperLink too busy to answer in time must not mask why we stop."""
        self.flwr("stop", run_id, self.connection, timeout=30)

    def server_log(self, run_id: str) -> str:
        """The ServerApp's log; a note instead when `flwr log` does not answer in time (a
        loaded machine), since the run's results are already on disk."""
        out = self.flwr("log", run_id, self.connection, "--show", timeout=60)
        if out.returncode == FLWR_TIMED_OUT:
            return f"(server log of run {run_id} unavailable: {out.stderr.strip()})\n"
        return out.stdout
