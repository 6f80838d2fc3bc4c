"""What the operator's machine must offer before Flower's processes start: a free port, a
directory that can be written, a database file SQLite can open, room on the disk. Each check
raises `PreflightError` with one line naming the option, the value and the problem, so that a
mistake is named where it is made, before anything is left half-started
(docs/reliability.md#operator-mistakes)."""

from __future__ import annotations

import errno
import os
import socket
import tempfile
from pathlib import Path

MIN_FREE_MB = 64
"""Free space a run's directory needs to start: Flower's SuperLink database and the app bundle
it unpacks (a few MB for a small run), results and checkpoints. The disk can still fill later;
the launcher then stops the run with the reason (pollen.tools.diagnosis)."""

SQLITE_HEADER = b"SQLite format 3\x00"


class PreflightError(ValueError):
    """A port, directory, file or disk that cannot serve: one line, for `pollen: error:`."""


def port_number(text: str) -> int:
    """A TCP port given on the command line (argparse `type=`): 1 to 65535."""
    try:
        port = int(text)
    except ValueError:
        raise PreflightError(f"{text!r} is not a port number (1 to 65535)") from None
    if not 0 < port < 65536:
        raise PreflightError(f"{port} is not a port number (1 to 65535)")
    return port


def check_port_free(host: str, port: int, option: str) -> None:
    """Nothing on this machine listens on `host:port`, and `host` is one of its addresses:
    checked by binding it the way a server does (SO_REUSEADDR, so that connections of an
    earlier server still closing do not count), then letting it go again."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise PreflightError(
            f"{option}: host {host!r} cannot be resolved ({exc.strerror})"
        ) from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PreflightError(
                    f"{option} {port}: port {port} on {host} is already in use by another "
                    f"program (`ss -ltnp 'sport = :{port}'` shows which); stop it or choose "
                    "another port"
                ) from None
            if exc.errno == errno.EADDRNOTAVAIL:
                raise PreflightError(
                    f"{option}: {host} is not an address of this machine"
                ) from None
            if exc.errno == errno.EACCES:
                raise PreflightError(
                    f"{option} {port}: binding port {port} needs privileges this process "
                    "lacks (ports below 1024 are reserved to root); choose a port above 1023"
                ) from None
            raise PreflightError(
                f"{option} {port}: cannot listen on {host}: {exc.strerror}"
            ) from None


def nearest_existing(path: Path) -> Path:
    """`path`, or the closest of its parents that exists."""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return probe


def check_writable_dir(path: Path, option: str) -> None:
    """The directory `option` names is (or can become) one this process can write to; nothing
    is created."""
    if path.exists() and not path.is_dir():
        raise PreflightError(f"{option} {path} is a file, not a directory")
    probe = nearest_existing(path)
    if not probe.is_dir():
        raise PreflightError(f"{option} {path}: {probe} is a file, not a directory")
    try:
        os.rmdir(tempfile.mkdtemp(dir=probe, prefix=".pollen-write-check-"))
    except OSError as exc:
        raise PreflightError(
            f"{option} {path} cannot be written: {exc.strerror or exc} (in {probe})"
        ) from None


def check_input_dir(path: Path, option: str) -> None:
    """A directory to read from exists, is a directory and can be listed."""
    if not path.exists():
        raise PreflightError(f"{option} {path} does not exist")
    if not path.is_dir():
        raise PreflightError(f"{option} {path} is a file, not a directory")
    try:
        next(os.scandir(path), None)
    except OSError as exc:
        raise PreflightError(f"{option} {path} cannot be read: {exc.strerror}") from None


def check_readable_file(path: Path, option: str) -> None:
    """A file to read exists, is a file and can be read."""
    if not path.exists():
        raise PreflightError(f"{option} {path} does not exist")
    if path.is_dir():
        raise PreflightError(f"{option} {path} is a directory, not a file")
    try:
        with open(path, "rb") as fh:
            fh.read(1)
    except OSError as exc:
        raise PreflightError(f"{option} {path} cannot be read: {exc.strerror}") from None


def check_database(text: str, option: str = "--database") -> None:
    """A SQLite database file SQLite can open: `:memory:`, or a path whose directory exists and
    can be written (SQLite writes a journal beside the file), which is not a directory and, if
    it exists, is an SQLite database (or empty) this process can read and write. A missing
    directory is not created: it is most often a typo or a volume that is not mounted."""
    if text == ":memory:":
        return
    path = Path(text)
    if path.is_dir():
        raise PreflightError(f"{option} {path} is a directory; give the database file's path")
    parent = path.parent
    if not parent.exists():
        raise PreflightError(
            f"{option} {path}: the directory {parent} does not exist (create it, or mount the "
            "volume that should hold it)"
        )
    if not parent.is_dir():
        raise PreflightError(f"{option} {path}: {parent} is a file, not a directory")
    check_writable_dir(parent, option)
    if not path.exists():
        return
    try:
        with open(path, "r+b") as fh:
            head = fh.read(len(SQLITE_HEADER))
    except OSError as exc:
        raise PreflightError(f"{option} {path} cannot be opened: {exc.strerror}") from None
    if head and head != SQLITE_HEADER:
        raise PreflightError(
            f"{option} {path} is not an SQLite database (give a new file's path, or the "
            "SuperLink database an earlier `pollen server --database` wrote)"
        )


def free_mb(path: Path) -> float:
    """MB this process may still write on the filesystem that holds `path` (or would)."""
    stat = os.statvfs(nearest_existing(path))
    return stat.f_bavail * stat.f_frsize / 2**20


def check_free_space(path: Path, option: str, need_mb: float = MIN_FREE_MB) -> None:
    """At least `need_mb` MB free where `path` is (or would be) written."""
    free = free_mb(path)
    if free < need_mb:
        raise PreflightError(
            f"{option} {path}: no space left on device (only {free:.1f} MB free on its "
            f"filesystem; a run needs at least {need_mb:g} MB): free space or choose another "
            "directory"
        )
