"""The `pollen` command line's argument parser: one function per command adds its arguments,
each command's --help ends with an example, and argparse's mistakes are one line."""

from __future__ import annotations

import argparse
import math
from typing import Any, NoReturn

from pollen.core.protection import NODE_ATTACKS
from pollen.tools import preflight
from pollen.tools.cli.client import cmd_client
from pollen.tools.cli.data import cmd_data_download, cmd_data_summary
from pollen.tools.cli.deploy import cmd_deploy
from pollen.tools.cli.experiment import cmd_experiment
from pollen.tools.cli.info import cmd_algorithms, cmd_datasets, cmd_settings
from pollen.tools.cli.report import cmd_report
from pollen.tools.cli.run import cmd_run
from pollen.tools.cli.server import cmd_server
from pollen.tools.cli.simulate import (
    CLIENTS_PER_NODE,
    MOST_CLIENTS_PER_NODE,
    MOST_NODES,
    NODES_PER_PARALLEL_CLIENT,
    cmd_simulate,
)
from pollen.tools.follow import START_TIMEOUT

DESCRIPTION = (
    "`pollen`: run federations locally (deploy, simulate), join real ones (server, client, run),\n"
    "and read results (report)."
)
"""The top-level --help's description."""


EXAMPLES = {
    "deploy": (
        "pollen deploy --algorithm fedem --dataset mnist-5k --clients 3 --rounds 5 --out "
        "results/fedem"
    ),
    "simulate": (
        "pollen simulate --algorithm fedavg --clients 20 --rounds 50 --set "
        "fraction-train=0.25\n  pollen simulate --algorithm fedavg --clients 8 --gpus-per-client "
        "0.25 --set amp=true"
    ),
    "run": (
        "pollen run --superlink 127.0.0.1:9093 --root-certificates certs/ca.crt "
        "--signing-key certs/signing.key --algorithm fedavg --clients 2 --rounds 20"
    ),
    "server": (
        "pollen server --tls-dir certs --auth --allow-list certs/supernodes --database superlink.db"
    ),
    "client": (
        "pollen client --superlink server.example.org:9092 --root-certificates ca.crt "
        "--auth-key node-0.key --trusted-key signing.pub --partition-id 0 "
        "--num-partitions 2"
    ),
    "report": "pollen report results/fedavg results/local --out results/compare",
    "experiment": (
        "pollen experiment experiments/fedem_synthetic.toml --seeds 0\n  pollen experiment "
        "experiments/fedem_cifar10.toml --methods fedem --gpus-per-client 0.5"
    ),
    "data": "pollen data summary --set dataset=mnist-5k --set num-clients=5",
    "download": "pollen data download cifar10 --data-dir ~/data",
    "summary": (
        "pollen data summary --set dataset=mnist-5k --set num-clients=5 --set partitioner=dirichlet"
    ),
    "settings": "pollen settings fedem",
    "algorithms": "pollen algorithms",
    "datasets": "pollen datasets",
}
"""One example per command, shown at the end of its --help."""


class _Help(argparse.RawDescriptionHelpFormatter):
    """--help with each option's default (where it has one) and the command's example kept as
    written."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if default in (None, False, [], argparse.SUPPRESS) or "%(default)" in text:
            return text
        if action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE):
            return f"{text} (default: %(default)s)"
        return text


def _command(sub: Any, name: str, **kwargs: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(
        name, formatter_class=_Help, epilog=f"example:\n  {EXAMPLES[name]}", **kwargs
    )
    return parser


class _Parser(argparse.ArgumentParser):
    """argparse's mistakes in Pollen's form: one line, `pollen: error: ...`, exit 2 (argparse
    prints the usage first, then `pollen COMMAND: error: ...`)."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("pollen").strip()
        where = f"pollen {command} --help" if command else "pollen --help"
        self.exit(2, f"pollen: error: {message} (see {where})\n")


def _port(text: str) -> int:
    """argparse `type=` of a port option: 1 to 65535, or argparse's one line."""
    try:
        return preflight.port_number(text)
    except preflight.PreflightError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _seconds(text: str) -> float:
    """argparse `type=` of a duration: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def _accuracy(text: str) -> float:
    """argparse `type=` of an accuracy: a fraction, 0 to 1."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not an accuracy between 0 and 1")
    return value


def _add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--algorithm", help="algorithm (see `pollen algorithms`)")
    p.add_argument("--dataset", help="dataset (see `pollen datasets`)")
    p.add_argument("--clients", type=int, help="number of clients (data partitions)")
    p.add_argument("--rounds", type=int, help="number of rounds")
    p.add_argument("--out", help="results directory (default: results/<algorithm>-<time>)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any other run setting (see `pollen settings`); repeatable",
    )
    p.add_argument(
        "--resume", action="store_true", help="continue the run in --out from its last checkpoint"
    )
    p.add_argument(
        "--timeout", type=float, default=24 * 3600, help="stop the run after this many seconds"
    )
    p.add_argument(
        "--start-timeout",
        type=_seconds,
        default=START_TIMEOUT,
        metavar="S",
        help="stop the run when its ServerApp has written nothing this many seconds after the "
        "submission (it cannot start)",
    )
    p.add_argument(
        "--plain",
        action="store_true",
        help="progress as plain lines (for logs and CI; the default when the output is not a "
        "terminal) instead of a live progress display",
    )
    p.add_argument(
        "--tensorboard",
        metavar="DIR",
        help="write per-round server and client metrics for TensorBoard to DIR/<results "
        "directory name> (needs pollen[tensorboard]); `tensorboard --logdir DIR` shows them",
    )


def _add_worker_option(p: argparse.ArgumentParser, nodes: str) -> None:
    p.add_argument(
        "--no-worker",
        action="store_true",
        help=f"no resident worker beside {nodes}: each message's ClientApp process imports "
        "torch and loads the data itself (slower; less memory between messages)",
    )


def _add_attack_options(p: argparse.ArgumentParser, who: str) -> None:
    p.add_argument(
        "--attack",
        choices=NODE_ATTACKS,
        help=f"{who} attacks the run (evaluation of robust rules, docs/robustness.md#attacks): "
        "its training replies are changed (label-flip: its labels)",
    )
    p.add_argument(
        "--attack-scale",
        type=float,
        default=10.0,
        metavar="S",
        help="sign-flip sends -S x the honest update; model-replacement boosts by S",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="pollen", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_deploy(sub)
    _add_simulate(sub)
    _add_run(sub)
    _add_server(sub)
    _add_client(sub)
    _add_report(sub)
    _add_experiment(sub)
    _add_data(sub)
    _add_settings(sub)
    _add_listings(sub)
    return parser


def _add_deploy(sub: Any) -> None:
    """`pollen deploy`'s arguments."""
    p = _command(sub, "deploy", help="SuperLink + N SuperNodes as processes on loopback (gRPC)")
    _add_run_options(p)
    p.add_argument("--tls-dir", help="directory with ca.crt, server.pem, server.key")
    p.add_argument(
        "--auth",
        action="store_true",
        help="SuperNode authentication: node i signs with <tls-dir>/supernodes/node-i.key, "
        "the SuperLink accepts only the registered keys",
    )
    p.add_argument(
        "--gpus",
        metavar="LIST",
        help="CUDA GPUs for the SuperNodes, e.g. 0,1: node i gets GPU LIST[i mod len(LIST)] "
        "(CUDA_VISIBLE_DEVICES); default: every node sees every GPU",
    )
    _add_attack_options(p, "each of the --attack-nodes last SuperNodes")
    p.add_argument(
        "--attack-nodes",
        type=int,
        default=1,
        metavar="K",
        help="with --attack: how many SuperNodes attack (the last K; default 1)",
    )
    _add_worker_option(p, "every SuperNode")
    p.add_argument(
        "--superlink-database",
        metavar="FILE",
        help="keep the SuperLink's state in this SQLite file (to inspect it afterwards) instead "
        "of in memory; with many SuperNodes on one machine its lock loses messages "
        "(docs/reliability.md#load)",
    )
    p.add_argument(
        "--worker-per-node",
        action="store_true",
        help="a resident worker for each SuperNode (their messages handled in parallel, about "
        "0.5 GB more per node) in place of one shared by all; always so with --gpus",
    )
    p.set_defaults(func=cmd_deploy)


def _add_simulate(sub: Any) -> None:
    """`pollen simulate`'s arguments."""
    p = _command(sub, "simulate", help="the same run on Flower's simulation runtime")
    _add_run_options(p)
    p.add_argument("--parallel", type=int, default=2, help="clients trained at once")
    p.add_argument(
        "--nodes",
        type=int,
        metavar="K",
        help="simulated SuperNodes the clients are packed onto (each hosts a contiguous block "
        f"of client ids; one message per node and phase); default "
        f"{NODES_PER_PARALLEL_CLIENT} x --parallel or one per {CLIENTS_PER_NODE} to "
        f"{MOST_CLIENTS_PER_NODE} clients (the smaller the model, the more) up to {MOST_NODES}, "
        "whichever is more, at most one per client",
    )
    p.add_argument(
        "--gpus-per-client",
        type=float,
        default=0.0,
        metavar="F",
        help="share of a GPU each client reserves in Ray (0.5: two clients per GPU); 0: the "
        "clients see no GPU and train on the CPU",
    )
    p.add_argument(
        "--ray-address",
        metavar="HOST:PORT",
        help="run the clients on an existing Ray cluster (its head's `ray start --head` "
        "address; RAY_ADDRESS in the environment does the same), one CPU per client, "
        "--parallel aside; default: a Ray instance of the run's own on this machine",
    )
    p.set_defaults(func=cmd_simulate)


def _add_run(sub: Any) -> None:
    """`pollen run`'s arguments."""
    p = _command(sub, "run", help="submit a run to a running SuperLink and follow it")
    _add_run_options(p)
    p.add_argument("--superlink", required=True, help="SuperLink HOST:PORT (its --port)")
    p.add_argument("--root-certificates", help="CA certificate when the SuperLink uses TLS")
    p.add_argument(
        "--signing-key",
        metavar="FILE",
        help="the operator's private key (signing.key): sign the app so SuperNodes run it",
    )
    p.add_argument(
        "--wait-superlink",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="how long to wait for the SuperLink to answer before submitting",
    )
    p.set_defaults(func=cmd_run)


def _add_server(sub: Any) -> None:
    """`pollen server`'s arguments."""
    p = _command(sub, "server", help="start a SuperLink for clients on other machines")
    p.add_argument(
        "--port", type=_port, default=9093, help="HTTP API (Control + Runtime): runs are submitted"
    )
    p.add_argument(
        "--api-host",
        default="127.0.0.1",
        help="interface of the HTTP API; loopback, so only this machine can submit runs",
    )
    p.add_argument(
        "--expose-api",
        action="store_true",
        help="bind the HTTP API to all interfaces: whoever reaches --port can then submit a run "
        "(run code in the ServerApp and on every client)",
    )
    p.add_argument("--fleet-port", type=_port, default=9092, help="Fleet API (gRPC) for SuperNodes")
    p.add_argument(
        "--fleet-host", default="0.0.0.0", help="interface of the Fleet API (all, by default)"
    )
    p.add_argument("--tls-dir", help="directory with ca.crt, server.pem, server.key")
    p.add_argument(
        "--insecure", action="store_true", help="no TLS: only on a network you trust (required "
        "when no --tls-dir is given)"
    )  # fmt: skip
    p.add_argument("--auth", action="store_true", help="accept only registered SuperNodes")
    p.add_argument(
        "--allow-list",
        metavar="DIR",
        help="with --auth: register the SuperNode public keys (*.pub) in DIR at start",
    )
    p.add_argument(
        "--isolation",
        choices=["subprocess", "process"],
        default="subprocess",
        help="process: the ServerApp runs in a separate `flower-superexec` (another container)",
    )
    p.add_argument(
        "--superexec-auth-secret-file",
        metavar="FILE",
        help="with --isolation process: the secret the ServerApp's SuperExec must prove it "
        "holds (scripts/generate-certs.sh writes superexec.secret)",
    )
    p.add_argument("--database", help="SQLite file keeping runs across SuperLink restarts")
    p.add_argument("--workdir", help="with --allow-list: where the flwr CLI keeps its files")
    p.add_argument(
        "--ready-file",
        metavar="FILE",
        help="written once the SuperLink answers and the allow-list is registered (a health check)",
    )
    p.set_defaults(func=cmd_server)


def _add_client(sub: Any) -> None:
    """`pollen client`'s arguments."""
    p = _command(sub, "client", help="start a SuperNode serving one partition")
    p.add_argument("--superlink", required=True, help="SuperLink fleet address HOST:PORT")
    p.add_argument("--partition-id", type=int, required=True)
    p.add_argument("--num-partitions", type=int, required=True)
    p.add_argument(
        "--state-dir",
        default="pollen-client-state",
        help="where this client's personal state is kept across restarts",
    )
    p.add_argument("--data-dir", help="directory with torchvision datasets")
    p.add_argument("--cache-dir", help="partition cache directory")
    p.add_argument(
        "--port", type=_port, help="local Runtime API port for its ClientApps (default: a free one)"
    )
    p.add_argument(
        "--max-wait-time",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="give up when the SuperLink cannot be reached for this long",
    )
    p.add_argument(
        "--wait-forever", action="store_true", help="never give up reconnecting to the SuperLink"
    )
    p.add_argument("--root-certificates", help="CA certificate when the SuperLink uses TLS")
    p.add_argument(
        "--insecure", action="store_true", help="no TLS: only on a network you trust (required "
        "when no --root-certificates is given)"
    )  # fmt: skip
    p.add_argument(
        "--auth-key",
        help="private key registered with the SuperLink; it also signs the keys this node's "
        "client advertises in secure aggregation",
    )
    p.add_argument(
        "--peer-keys",
        metavar="DIR",
        help="the registered SuperNodes' public keys (*.pub, the server's --allow-list): in "
        "secure aggregation this node then takes only keys signed by one of them "
        "(docs/security.md#threat-model)",
    )
    p.add_argument(
        "--trusted-key",
        metavar="FILE",
        help="the operator's public key (signing.pub): only apps signed with its private half run",
    )
    p.add_argument(
        "--allow-any-app",
        action="store_true",
        help="run any app the SuperLink hands this node, signed or not",
    )
    p.add_argument(
        "--gpu",
        type=int,
        metavar="N",
        help="train on CUDA GPU N only (CUDA_VISIBLE_DEVICES=N); default: every GPU is visible "
        "and device=auto takes the first",
    )
    _add_attack_options(p, "this node")
    _add_worker_option(p, "the SuperNode")
    p.set_defaults(func=cmd_client)


def _add_report(sub: Any) -> None:
    """`pollen report`'s arguments."""
    p = _command(
        sub, "report", help="plots, CSV files and a Markdown summary of results directories"
    )
    p.add_argument(
        "dirs", nargs="+", help="results directories; runs that differ only in the seed are "
        "drawn as mean ± std"
    )  # fmt: skip
    p.add_argument("--out", help="where to write (default: the first directory's report/)")
    p.add_argument(
        "--format",
        default="png",
        metavar="LIST",
        help="plot formats, comma-separated: png, svg, pdf (e.g. png,svg,pdf)",
    )
    p.add_argument(
        "--accuracy",
        nargs="+",
        type=_accuracy,
        metavar="A",
        help="accuracies (fractions, e.g. 0.8 0.9) whose time to reach report.md states per "
        "run; default: 50%%, 75%% and 90%% of the best final accuracy among the runs",
    )
    p.set_defaults(func=cmd_report)


def _add_experiment(sub: Any) -> None:
    """`pollen experiment`'s arguments."""
    p = _command(
        sub,
        "experiment",
        help="run a paper experiment file: methods x seeds, then a table of mean ± std",
    )
    p.add_argument("file", help="experiment file (see experiments/)")
    p.add_argument("--out", help="results directory (default: results/<experiment name>)")
    p.add_argument(
        "--table-only", action="store_true", help="only tabulate the runs already in --out"
    )
    p.add_argument("--seeds", help="run these seeds instead of the file's, e.g. 0 or 0,1")
    p.add_argument("--methods", help="run only these of the file's methods, e.g. fedem,fedavg")
    p.add_argument(
        "--gpus-per-client",
        type=float,
        metavar="F",
        help="simulation: each client reserves F of a GPU, passed to every `pollen simulate` "
        "(without it, simulated clients train on the CPU)",
    )
    p.add_argument("--parallel", type=int, metavar="N", help="simulation: clients trained at once")
    p.set_defaults(func=cmd_experiment)


def _add_data(sub: Any) -> None:
    """`pollen data` and its commands, download and summary."""
    data = _command(sub, "data", help="datasets: download, partition summary")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    _add_data_download(data_sub)
    _add_data_summary(data_sub)


def _add_data_download(data_sub: Any) -> None:
    """`pollen data download`'s arguments."""
    p = _command(data_sub, "download", help="fetch a torchvision dataset (needs internet)")
    p.add_argument("name")
    p.add_argument("--data-dir", required=True)
    p.set_defaults(func=cmd_data_download)


def _add_data_summary(data_sub: Any) -> None:
    """`pollen data summary`'s arguments."""
    p = _command(data_sub, "summary", help="per-client sizes and label counts of a partition")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--plot",
        nargs="?",
        const="partition.png",
        metavar="FILE",
        help="draw the label distribution per client (stacked bars with counts) to FILE "
        "(.png, .svg or .pdf; default partition.png)",
    )
    p.set_defaults(func=cmd_data_summary)


def _add_settings(sub: Any) -> None:
    """`pollen settings`'s argument."""
    p = _command(sub, "settings", help="list the run settings (all, or one algorithm's)")
    p.add_argument(
        "algorithm", nargs="?", help="only the settings this algorithm reads (and the common ones)"
    )
    p.set_defaults(func=cmd_settings)


def _add_listings(sub: Any) -> None:
    """`pollen algorithms` and `pollen datasets`, which take no arguments."""
    for name, func, text in (
        ("algorithms", cmd_algorithms, "list algorithms"),
        ("datasets", cmd_datasets, "list datasets"),
    ):
        p = _command(sub, name, help=text)
        p.set_defaults(func=func)
