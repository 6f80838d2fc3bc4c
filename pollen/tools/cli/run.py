"""`pollen run`: a run submitted to a SuperLink that is already running (multi-machine
deployment), signed with the operator's key, and followed to its end."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from pollen.core import rundir
from pollen.core.settings import RunSettings
from pollen.tools.cli.checks import host_port, warn
from pollen.tools.cli.outcome import run_and_report
from pollen.tools.cli.resolve import Watch, one_client_per_node, resolve_run_settings
from pollen.tools.local_federation import LocalFederation
from pollen.tools.processes import LaunchError


def cmd_run(args: argparse.Namespace) -> int:
    """Submit a run to a SuperLink that is already running (multi-machine deployment)."""
    host_port(args.superlink, "--superlink")
    signing_key = _signing_key(args.signing_key)
    resolved = resolve_run_settings(args, local=False)
    one_client_per_node(RunSettings.of(resolved))
    out = Path(RunSettings.of(resolved).out_dir)
    fresh = not out.exists()
    fed = LocalFederation(out / rundir.PROCESSES, signing_key=signing_key)
    fed.write_connection(
        args.superlink, Path(args.root_certificates) if args.root_certificates else None
    )
    print(f"waiting for the SuperLink at {args.superlink}", flush=True)
    try:
        fed.wait_reachable(args.superlink, args.wait_superlink)
    except (LaunchError, KeyboardInterrupt):
        if fresh:  # nothing was submitted: leave no directory behind
            shutil.rmtree(out, ignore_errors=True)
        raise
    return run_and_report(fed, resolved, args.timeout, Watch.of(args))


def _signing_key(path: str | None) -> Path | None:
    """The operator's private key for `pollen run`, read once here so that a bad one stops the
    command before anything is submitted."""
    from pollen.tools.signing import SigningError, load_private_key  # lazy: cryptography

    if not path:
        warn(
            "no --signing-key: the run is submitted unsigned, and SuperNodes started with "
            "--trusted-key will refuse to run it"
        )
        return None
    try:
        load_private_key(Path(path))
    except SigningError as exc:
        raise LaunchError(str(exc)) from None
    return Path(path).resolve()
