"""A run submitted to a federation and followed to its end (run_and_report), then told: its final
accuracy, or one line saying why it did not complete (the ServerApp's reason, a full disk)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from pollen.core import rundir
from pollen.core.files import atomic_write_json
from pollen.core.settings import RunSettings, Scalar
from pollen.tools import board, preflight
from pollen.tools.cli.resolve import Watch
from pollen.tools.diagnosis import no_space
from pollen.tools.follow import follow
from pollen.tools.local_federation import LocalFederation
from pollen.tools.processes import DiskFull


def _failure(out: Path, status: Mapping[str, Any]) -> str:
    """One line saying why a run did not complete: the ServerApp's reason from summary.json
    (or resume-failed.json), else Flower's status, and where the full log is."""
    from server.results import brief  # lazy: only on this path

    reason = ""
    for name in (rundir.RESUME_FAILED, rundir.SUMMARY):
        record = rundir.read_summary(out, name)
        if record is not None and record.status == rundir.FAILED and record.reason:
            reason = record.reason
            break
    if not reason:
        reason = f"{status.get('status', 'unknown')}: {status.get('status-details', '')}"
    return f"failed: {brief(reason, limit=600)} (full log: {out / rundir.SERVER_LOG})"


def _no_space(out: Path, detail: str) -> str:
    """The line for a run stopped by a full disk: where, what is kept, how to go on."""
    from server import checkpoint  # lazy: only on this path

    try:
        kept = checkpoint.load(out).server_round
    except checkpoint.CheckpointError:
        kept = 0
    then = (
        f"its checkpoint of round {kept} is kept: free space, then continue it with --resume "
        f"--out {out}"
        if kept
        else "no round was saved: free space, then start it again"
    )
    if not detail.startswith("no space left on device"):
        detail = (
            f"no space left on device in {out} ({preflight.free_mb(out):.1f} MB free; {detail})"
        )
    return f"{detail}; the run was stopped and {then}"


def _record_restarts(summary_path: Path, restarts: list[dict[str, Any]]) -> None:
    """Add the SuperNode restarts of this run to the summary the ServerApp wrote."""
    summary = rundir.read_summary(summary_path.parent)
    if summary is None:
        return  # no summary to add to: the events file has them
    restarted = [*(summary.node_restarts or []), *restarts]
    atomic_write_json(summary_path, replace(summary, node_restarts=restarted).to_json())


def run_and_report(
    fed: LocalFederation, resolved: dict[str, Scalar], timeout: float, watch: Watch = Watch()
) -> int:
    run = RunSettings.of(resolved)
    out = Path(run.out_dir)
    sinks = []
    if watch.tensorboard is not None:  # before the run: the writer imports torch (seconds)
        log_dir = watch.tensorboard / out.name
        sinks.append(board.Board(log_dir, run.num_rounds, run.algorithm))
        print(f"TensorBoard: {log_dir} (tensorboard --logdir {watch.tensorboard})", flush=True)
    try:
        run_id = fed.submit(resolved)
    except BaseException:
        for sink in sinks:
            sink.close(None)
        raise
    print(f"run {run_id} submitted", flush=True)
    try:
        status = follow(
            fed, run_id, out, timeout, num_rounds=run.num_rounds, history=run.resume,
            plain=watch.plain, sinks=sinks, start_timeout=watch.start_timeout,
        )  # fmt: skip
    except KeyboardInterrupt:
        fed.stop_run(run_id)
        raise
    except DiskFull as exc:
        print(f"pollen: error: run {run_id}: {_no_space(out, str(exc))}", file=sys.stderr)
        return 1
    log = fed.server_log(run_id)
    with contextlib.suppress(OSError):  # a full disk: said below
        (out / rundir.SERVER_LOG).write_text(log)
    if fed.restart_log:
        _record_restarts(out / rundir.SUMMARY, fed.restart_log)
    state = status.get("status", "unknown")
    lost = fed.lost_messages()  # what Flower's processes logged about messages they lost
    if state != "finished:completed":
        if no_space(log) or preflight.free_mb(out) < 1:
            print(f"pollen: error: run {run_id}: {_no_space(out, 'the ServerApp could not write')}",
                  file=sys.stderr)  # fmt: skip
            return 1
        cause = f"; {lost}" if lost else ""
        print(f"pollen: error: run {run_id} {_failure(out, status)}{cause}", file=sys.stderr)
        return 1
    if lost:
        print(f"pollen: note: Flower lost messages on the way, and the run went on: {lost}")
    summary = rundir.read_summary(out)
    if summary is not None and summary.final is not None:
        final = summary.final.eval
        if "test-accuracy" in final:
            print(
                f"final: mean client test-accuracy {final['test-accuracy']:.4f} "
                f"(10th percentile {final.get('test-accuracy-p10', float('nan')):.4f})"
            )
    print(f"run {run_id} completed; results in {out}")
    return 0
