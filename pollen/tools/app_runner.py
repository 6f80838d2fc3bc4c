"""The app runner beside each of Pollen's SuperNodes: Flower's SuperExec, except that a
ClientApp starts only from a bundle signed by the operator.

`pollen client` (and `pollen deploy`) run `flower-supernode --isolation process`, so the
SuperNode starts no app process of its own, and start this runner instead:

    python -m pollen.tools.app_runner --trusted-key signing.pub -- <flower-superexec arguments>

It is Flower's `flower-superexec` with one change: a ClientApp task is launched as
`pollen-clientapp` (`clientapp_main` below) rather than `flwr-clientapp`. That process is
Flower's `flwr-clientapp` with one change: before Flower installs the bundle it pulled from the
SuperNode, `pollen.tools.signing.verify_bundle` checks its signature against the trusted key. A
bundle that is unsigned, signed by another key or altered is refused before any of its files is
written or imported: the ClientApp process logs one line and answers with an error reply, which the
ServerApp sees as a failed client. Only Flower's public entry points and one module attribute of
this process are replaced; Flower's files are unchanged.

This module imports nothing of Pollen's training code (it must stay light: one ClientApp
process per message).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pollen.tools.signing import SigningError, load_public_key, verify_bundle

TRUSTED_KEY_ENV = "POLLEN_TRUSTED_APP_KEY"
"""Path of the operator's public key, handed from the runner to its ClientApp processes."""

CLIENTAPP_COMMAND = "pollen-clientapp"


class UnverifiedAppError(RuntimeError):
    """A bundle this node will not run."""


def verified_installer(
    install: Callable[..., Any], trusted_key: Path
) -> Callable[..., Any]:
    """`install` (Flower's `install_from_fab`) that first verifies the bundle's signature."""
    def install_verified(fab_content: bytes, *args: Any, **kwargs: Any) -> Any:
        try:
            verify_bundle(fab_content, load_public_key(trusted_key))
        except SigningError as exc:
            print(f"pollen-clientapp: refused to run the app: {exc}", file=sys.stderr, flush=True)
            raise UnverifiedAppError(f"app refused by this node: {exc}") from None
        return install(fab_content, *args, **kwargs)

    return install_verified


def clientapp_main() -> None:
    """`pollen-clientapp`: Flower's `flwr-clientapp`, verifying the bundle before installing it."""
    from flwr.supernode.cli import flwr_clientapp  # lazy: flwr's SuperNode, only on this path
    from flwr.supernode.runtime import run_clientapp as runtime  # lazy: only on this path

    key = os.environ.get(TRUSTED_KEY_ENV, "")
    # No key means no app is trusted: the check then refuses every bundle.
    runtime.install_from_fab = verified_installer(  # type: ignore[attr-defined]
        runtime.install_from_fab, Path(key or "/nonexistent/pollen-trusted-key")
    )
    flwr_clientapp()


def main(argv: Sequence[str] | None = None) -> None:
    """Flower's SuperExec whose ClientApp processes are `pollen-clientapp`."""
    parser = argparse.ArgumentParser(prog="python -m pollen.tools.app_runner", description=__doc__)
    parser.add_argument("--trusted-key", required=True, help="the operator's public key")
    parser.add_argument("superexec_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    from flwr.supercore.cli import flower_superexec  # lazy: flwr's SuperExec, only on this path
    from flwr.supercore.constant import TASK_TYPE_TO_COMMAND, TaskType  # lazy: flwr, this path

    os.environ[TRUSTED_KEY_ENV] = str(Path(args.trusted_key).resolve())
    TASK_TYPE_TO_COMMAND[TaskType.CLIENT_APP] = CLIENTAPP_COMMAND
    rest = list(args.superexec_args)
    if rest[:1] == ["--"]:
        rest = rest[1:]
    sys.argv = ["flower-superexec", *rest]
    flower_superexec()


if __name__ == "__main__":
    main()
