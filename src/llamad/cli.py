"""The ``llamad`` command (console script): ``llamad daemon``, ``llamad config check|example``.

Each command is a function taking its parsed arguments and returning an exit
status, registered in :func:`build_parser`; the client commands of SPEC D4
(``load``, ``unload``, ``models``, ``complete``, ``chat``, ``status``, ...)
are added the same way.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

__all__ = ["build_parser", "main"]


def _daemon(args: argparse.Namespace) -> int:
    from llamad import daemon  # noqa: PLC0415  (loads the supervisor and the config)

    return daemon.main([] if args.config is None else ["--config", args.config])


def _config_check(args: argparse.Namespace) -> int:
    from llamad.config.cli import check  # noqa: PLC0415

    return check(args.file)


def _config_example(args: argparse.Namespace) -> int:
    from llamad.config.cli import example  # noqa: PLC0415

    sys.stdout.write(example())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llamad", description="a llama.cpp daemon with a KV cache"
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    daemon = commands.add_parser("daemon", help="run the daemon (until SIGTERM)")
    daemon.add_argument(
        "--config", metavar="FILE", help="TOML configuration (default: $LLAMAD_CONFIG)"
    )
    daemon.set_defaults(run=_daemon)

    config = commands.add_parser("config", help="check or print a configuration")
    actions = config.add_subparsers(dest="action", required=True, metavar="ACTION")
    check = actions.add_parser("check", help="validate a configuration without starting anything")
    check.add_argument("file", nargs="?", help="the TOML file (default: $LLAMAD_CONFIG, else none)")
    check.set_defaults(run=_config_check)
    example = actions.add_parser("example", help="print a commented example configuration")
    example.set_defaults(run=_config_example)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    status: int = args.run(args)
    return status


if __name__ == "__main__":
    sys.exit(main())
