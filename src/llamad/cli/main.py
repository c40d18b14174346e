"""The ``llamad`` command (console script; SPEC D4).

::

    llamad [--endpoint E] [--config FILE] [--timeout S] [--connect-timeout S] COMMAND ...

    daemon                      run the daemon (until SIGTERM)
    load MODEL [PATH] [-o K=V]  load a model, with a progress bar
    unload MODEL                stop a model's worker
    models                      the daemon's models
    complete [PROMPT]           complete a prompt, streaming the reply
    chat                        an interactive multi-turn chat
    embed TEXT / tokenize TEXT  a text's embedding / tokens
    status [MODEL]              models, sequences, queues, processes, restarts, tiers
    counters                    the cache's counters
    metrics                     Prometheus text: requests, latencies, cache, tiers
    cache gc / cache evict N    cache maintenance
    config check [FILE]         validate a configuration without starting anything
    config example              print a commented example configuration
    bench                       a quick benchmark (from a source checkout)

Every command but ``daemon``, ``config`` and ``bench`` talks to the running
daemon through the public :class:`llamad.Client`; the global options may
also follow the command. Read commands take ``--json``. Results go to
stdout; progress, summaries, logs and errors to stderr. An error prints one
line ``llamad: <code>: <message>`` and exits with its family's status
(:mod:`llamad.cli.errors` lists them).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from llamad import logs
from llamad.cli import control as cli_control
from llamad.cli import generate as cli_generate
from llamad.cli import install as cli_install
from llamad.cli import keys as cli_keys
from llamad.cli import metrics as cli_metrics
from llamad.cli.connect import DEFAULT_CONNECT_TIMEOUT, UsageError, connect
from llamad.cli.errors import (
    EXIT_CONFIG,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    error_line,
    exit_code,
)
from llamad.errors import LlamadError

__all__ = ["build_parser", "main"]


def _daemon(args: argparse.Namespace) -> int:
    from llamad.daemon import main as daemon  # noqa: PLC0415  (loads the supervisor and the config)

    return daemon.main([] if args.config is None else ["--config", args.config])


def _config_check(args: argparse.Namespace) -> int:
    from llamad.cli.config import check  # noqa: PLC0415

    # A refused file exits like a daemon refusing it (78), not with a bare 1.
    return EXIT_OK if check(args.file or args.config) == 0 else EXIT_CONFIG


def _config_example(args: argparse.Namespace) -> int:
    from llamad.cli.config import example  # noqa: PLC0415

    sys.stdout.write(example())
    return EXIT_OK


def _bench_root() -> Path | None:
    """The source checkout whose ``bench`` package to run: the current
    directory's, else the one this llamad was installed from (editable)."""
    here = Path(__file__).resolve().parents[2]
    for root in (Path.cwd(), here):
        if (root / "bench" / "worker_bench.py").is_file():
            return root
    return None


def _bench(args: argparse.Namespace) -> int:
    root = _bench_root()
    if root is None:
        sys.stderr.write(
            "llamad: bench: the benchmarks live in a source checkout's bench/ package, "
            "which this installation does not have: run `make bench` in a checkout\n"
        )
        return EXIT_ERROR
    # A quick subset, not recorded; `make bench` runs and records everything:
    # one round of the worker benchmark (cold, warm, decoding), or, as
    # `llamad bench peers [ARGS]`, one round of P1-P9 against llama-server and
    # llama-cpp-python (as far as bench/peers_setup.py has set them up).
    extra = list(args.bench_args)
    module = "bench.worker_bench"
    if extra[:1] == ["peers"]:
        module, extra = "bench.peers_bench", ["--no-record", *extra[1:]]
    command = [sys.executable, "-m", module, "--quick", *extra]
    return subprocess.run(command, cwd=root, check=False).returncode


def _global_options(parser: argparse.ArgumentParser, *, suppress: bool) -> None:
    """The options every client command takes; on the commands themselves
    ``suppress`` keeps an absent option from hiding one given before the command."""

    def default(value: object) -> object:
        return argparse.SUPPRESS if suppress else value

    parser.add_argument(
        "--endpoint",
        default=default(None),
        help="the daemon's endpoint (default: from the configuration, "
        "ipc://<runtime_dir>/llamad.sock)",
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        default=default(None),
        help="TOML configuration (default: $LLAMAD_CONFIG, else none)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        metavar="S",
        default=default(None),
        help="seconds a call (or a stream's first token) may take (default 300)",
    )
    parser.add_argument(
        "--connect-timeout",
        type=float,
        metavar="S",
        default=default(DEFAULT_CONNECT_TIMEOUT),
        help=f"seconds to wait for the daemon to answer (default {DEFAULT_CONNECT_TIMEOUT:g})",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llamad",
        description="llamad: a llama.cpp daemon with a token-exact KV cache",
        epilog="exit status: 0 ok, 1 error, 2 usage, 65 request refused, 66 not found, "
        "69 daemon unavailable, 70 model failed, 75 try again, 78 configuration, "
        "130 interrupted",
    )
    _global_options(parser, suppress=False)
    parser.set_defaults(client=False)
    common = argparse.ArgumentParser(add_help=False)
    _global_options(common, suppress=True)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    daemon = commands.add_parser("daemon", help="run the daemon (until SIGTERM)")
    daemon.add_argument(
        "--config",
        metavar="FILE",
        default=argparse.SUPPRESS,
        help="TOML configuration (default: $LLAMAD_CONFIG)",
    )
    daemon.set_defaults(run=_daemon)

    cli_control.add_commands(commands, common)
    cli_metrics.add_commands(commands, common)
    cli_generate.add_commands(commands, common)
    cli_keys.add_commands(commands)
    cli_install.add_commands(commands)

    config = commands.add_parser("config", help="check or print a configuration")
    actions = config.add_subparsers(dest="action", required=True, metavar="ACTION")
    check = actions.add_parser(
        "check", help="validate a configuration without starting anything (exit 78 if refused)"
    )
    check.add_argument("file", nargs="?", help="the TOML file (default: $LLAMAD_CONFIG, else none)")
    check.set_defaults(run=_config_check)
    example = actions.add_parser("example", help="print a commented example configuration")
    example.set_defaults(run=_config_example)

    # Every word after `bench` belongs to the benchmark script, options
    # included: a prefix character no argument starts with keeps argparse from
    # taking `--rounds` as an option of ours (REMAINDER alone stops at an
    # option), and `-h` reaches the script, which knows its own options.
    bench = commands.add_parser(
        "bench",
        help="a quick benchmark of the default model (from a source checkout); "
        "`bench peers`: one quick round of P1-P9 against llama-server and llama-cpp-python",
        prefix_chars="\0",
        add_help=False,
    )
    bench.add_argument(
        "bench_args",
        nargs=argparse.REMAINDER,
        help="passed to python -m bench.worker_bench (after `peers`: bench.peers_bench)",
    )
    bench.set_defaults(run=_bench)
    return parser


def _run_client_command(args: argparse.Namespace) -> int:
    # Results own stdout: logs (the client's included) go to stderr, at
    # warning unless LLAMAD_LOG_LEVEL says otherwise.
    logs.configure(level="warning", fmt="console")
    endpoint: str | None = args.endpoint
    try:
        client = connect(args)
        endpoint = client.endpoint
        with client:
            status: int = args.run(args, client)
            return status
    except LlamadError as exc:
        sys.stderr.write(error_line(exc, endpoint=endpoint) + "\n")
        return exit_code(exc)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.client:
            return _run_client_command(args)
        status: int = args.run(args)
        return status
    except UsageError as exc:
        sys.stderr.write(f"llamad: usage: {exc}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        sys.stderr.write("\nllamad: interrupted\n")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`llamad complete ... | head`): nothing left to say.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_ERROR
