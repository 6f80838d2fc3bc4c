"""`pollen`: run federations locally (deploy, simulate), join real ones (server, client, run),
and read results (report). `main` runs one command: the parser (parser.py) picks it, its module
(deploy, simulate, run, server, client, report, experiment, data, info) carries it out, and an
operator's mistake ends as one `pollen: error:` line."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence
from types import FrameType

from pollen.core.settings import SettingsError
from pollen.tools import preflight
from pollen.tools.cli.parser import build_parser
from pollen.tools.cli.resolve import NothingToDo
from pollen.tools.processes import LaunchError


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def os_error_line(exc: OSError) -> str:
    """An OSError as the one line an operator reads: what went wrong and the file it names."""
    where = f": {exc.filename}" if exc.filename else ""
    return f"{exc.strerror or exc}{where}"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    try:
        code: int = args.func(args)
        return code
    except (SettingsError, LaunchError, preflight.PreflightError) as exc:
        print(f"pollen: error: {exc}", file=sys.stderr)
        return 2
    except NothingToDo as exc:
        print(f"pollen: {exc}")
        return 0
    except BrokenPipeError:  # output piped into a reader that stopped (`| head`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:  # a file or directory the operator named that cannot be used
        print(f"pollen: error: {os_error_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("pollen: interrupted; all processes stopped", file=sys.stderr)
        return 130
