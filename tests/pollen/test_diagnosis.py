"""Flower's failures the operator can fix, read from what its processes print (the texts below
are Flower 1.39's own output, cut to the lines that matter), and the console copy that holds a
traceback back until it is known whether the process dies of it."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap

from pollen.tools.diagnosis import ConsoleCopy, known_cause, no_space

FLEET_PORT_TAKEN = """\
\x1b[92mINFO \x1b[0m:      SuperLinkLifespan: start
2026-11-26T23:40:02.771Z ERROR [uvicorn.error] Traceback (most recent call last):
  File ".../flwr/supercore/grpc.py", line 165, in generic_create_grpc_server
    sys.exit(f"Port in server address {server_address} is already in use.")
SystemExit: Port in server address 0.0.0.0:9092 is already in use.

2026-11-26T23:40:02.771Z ERROR [uvicorn.error] Application startup failed. Exiting.
"""
HTTP_PORT_TAKEN = """\
2026-11-26T23:44:46.672Z ERROR [uvicorn.error] [Errno 98] error while attempting to bind on \
address ('127.0.0.1', 9193): address already in use
2026-11-26T23:44:46.672Z INFO [uvicorn.error] Waiting for application shutdown.
"""
DATABASE_FULL = """\
\x1b[91mERROR \x1b[0m:     [/v1/runtime/push-logs][UnexpectedError:OperationalError] \
(sqlite3.OperationalError) database or disk is full
"""
DATABASE_UNOPENABLE = """\
sqlite3.OperationalError: unable to open database file
sqlalchemy.exc.OperationalError: (sqlite3.OperationalError) unable to open database file
"""


def test_known_failures_become_one_line() -> None:
    fleet = known_cause([FLEET_PORT_TAKEN])
    assert fleet is not None and fleet.startswith(
        "the Fleet API address 0.0.0.0:9092 is already in use by another program"
    )  # the address from SystemExit, not the source line's `{server_address}`
    http = known_cause([HTTP_PORT_TAKEN])
    assert http is not None and "HTTP API address 127.0.0.1:9193 is already in use" in http
    assert "no space left on device" in str(known_cause([DATABASE_FULL]))
    assert "cannot open the database file" in str(known_cause([DATABASE_UNOPENABLE]))
    assert known_cause(["INFO : Starting Flower SuperLink\n", "Some other failure\n"]) is None
    assert no_space("OSError: [Errno 28] No space left on device: 'metrics.jsonl'")
    assert not no_space(HTTP_PORT_TAKEN)


def _child(script: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip


def test_a_traceback_the_process_dies_of_is_held_back() -> None:
    child = _child("""
        import traceback
        print("INFO :      Starting Flower SuperLink", flush=True)
        try:
            1 / 0
        except ZeroDivisionError:
            traceback.print_exc()
        raise SystemExit(3)
        """)
    out = io.StringIO()
    copy = ConsoleCopy(child, out)
    child.wait()
    held = copy.finish()
    assert out.getvalue() == "INFO :      Starting Flower SuperLink\n"
    assert held[0].startswith("Traceback") and held[-1].startswith("ZeroDivisionError")
    copy.show(held)  # an unknown failure: the operator sees it all
    assert out.getvalue() == "INFO :      Starting Flower SuperLink\n" + "".join(held)


def test_a_traceback_the_process_lives_on_after_is_shown() -> None:
    out = io.StringIO()
    child = _child("""
        import sys, traceback
        try:
            1 / 0
        except ZeroDivisionError:
            traceback.print_exc(file=sys.stdout)
        print("INFO :      still serving", flush=True)
        """)
    copy = ConsoleCopy(child, out)
    child.wait()
    assert copy.finish() == []
    text = out.getvalue()
    assert text.startswith("Traceback") and text.endswith("INFO :      still serving\n")
