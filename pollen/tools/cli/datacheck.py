"""`python -m pollen.tools.cli.datacheck`: a run's data and model checked in a process of its
own (pollen.tools.cli.resolve.check_data_apart), so that the launcher never imports torch. Reads
the resolved settings as JSON on standard input and writes one JSON line: {"model-bytes": N}, or
{"error": "the one line that names the problem"}."""

from __future__ import annotations

import json
import sys

from pollen.core.settings import SettingsError
from pollen.tools.cli import os_error_line
from pollen.tools.cli.resolve import check_data


def main() -> int:
    resolved = json.loads(sys.stdin.read())
    try:
        answer: dict[str, object] = {"model-bytes": check_data(resolved)}
    except SettingsError as exc:
        answer = {"error": str(exc)}
    except OSError as exc:  # a file or directory the settings name that cannot be used
        answer = {"error": os_error_line(exc)}
    print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
