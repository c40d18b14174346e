"""The ``llamad`` commands of the daemon's control plane (its front).

``load``, ``unload``, ``models``, ``status``, ``counters``, ``cache gc``,
``cache evict``: each a function of its parsed arguments and a connected
:class:`llamad.Client`, returning the exit status. Results go to stdout
(``--json``: one JSON document), progress to stderr.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from llamad.cli import render
from llamad.cli.connect import UsageError, parse_options
from llamad.client.sync import Client
from llamad.config.units import parse_size
from llamad.tiers import LOCAL_TIERS

__all__ = ["add_commands"]


def _out(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def load(args: argparse.Namespace, client: Client) -> int:
    options = parse_options(args.option)
    bar: render.ProgressBar | None = None
    if not args.quiet:
        bar = render.ProgressBar(f"loading {args.model}", sys.stderr, terminal=sys.stderr.isatty())
    info = client.load_model(args.model, args.path, progress=bar.update if bar else None, **options)
    if bar is not None:
        bar.finish(f"loaded {args.model}")
    _out(render.to_json(info) if args.json else render.model_text(info))
    return 0


def unload(args: argparse.Namespace, client: Client) -> int:
    client.unload(args.model)
    _out(f"unloaded {args.model}\n")
    return 0


def models(args: argparse.Namespace, client: Client) -> int:
    found = client.list_models()
    _out(render.to_json(found) if args.json else render.models_table(found))
    return 0


def status(args: argparse.Namespace, client: Client) -> int:
    if args.model:
        one = client.status(args.model)
        _out(render.to_json(one) if args.json else render.model_status_text(one))
    else:
        daemon = client.status()
        _out(render.to_json(daemon) if args.json else render.status_text(daemon))
    return 0


def counters(args: argparse.Namespace, client: Client) -> int:
    found = client.counters()
    _out(render.to_json(found) if args.json else render.counters_text(found))
    return 0


def cache_gc(args: argparse.Namespace, client: Client) -> int:
    report = client.gc()
    _out(render.to_json(report) if args.json else render.gc_text(report))
    return 0


def cache_evict(args: argparse.Namespace, client: Client) -> int:
    try:
        n = parse_size(int(args.bytes) if args.bytes.isdigit() else args.bytes)
    except ValueError as exc:
        raise UsageError(f"BYTES: {exc}") from None
    freed = client.evict_bytes(n, args.tier or None)
    if args.json:
        _out(render.to_json({"requested": n, "tiers": args.tier or None, "bytes_freed": freed}))
    else:
        _out(f"evicted {render.human_bytes(freed)} ({freed} bytes; asked {n})\n")
    return 0


def add_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    """Register the commands on ``commands`` (argparse's subparsers action);
    ``common`` is the parent parser of the global options."""

    def command(name: str, help_: str, run: Any, *, json: bool) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = commands.add_parser(
            name, help=help_, description=help_, parents=[common]
        )
        if json:
            p.add_argument("--json", action="store_true", help="print JSON for scripts")
        p.set_defaults(run=run, client=True)
        return p

    p = command("load", "load a model, with a progress bar", load, json=True)
    p.add_argument("model", metavar="MODEL", help="the model id to serve it as")
    p.add_argument(
        "path", metavar="PATH", nargs="?", help="its GGUF file (default: its configured path)"
    )
    p.add_argument(
        "-o",
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a key of a [models.<id>] table (n_ctx=8192, n_seq_max=4, keep_alive=10m...)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")

    p = command("unload", "stop a model's worker (its cache rows stay)", unload, json=False)
    p.add_argument("model", metavar="MODEL")

    command("models", "list the daemon's models", models, json=True)

    p = command(
        "status",
        "models, sequences, queues, processes and restarts, cache tiers",
        status,
        json=True,
    )
    p.add_argument("model", metavar="MODEL", nargs="?", help="one model only")

    command("counters", "the cache's counters", counters, json=True)

    cache = commands.add_parser("cache", help="cache maintenance: gc, evict")
    actions = cache.add_subparsers(dest="action", required=True, metavar="ACTION")
    gc = actions.add_parser("gc", help="run the cache's garbage collection now", parents=[common])
    gc.add_argument("--json", action="store_true", help="print JSON for scripts")
    gc.set_defaults(run=cache_gc, client=True)
    evict = actions.add_parser(
        "evict", help="evict cache rows (least recently used first)", parents=[common]
    )
    evict.add_argument("bytes", metavar="BYTES", help="at least this much: 1048576, 512MiB, 2GiB")
    evict.add_argument(
        "--tier",
        action="append",
        # The remote tier is shared by every daemon and is not cache-meta's to evict.
        choices=LOCAL_TIERS,
        help="only from this tier (repeatable; default all)",
    )
    evict.add_argument("--json", action="store_true", help="print JSON for scripts")
    evict.set_defaults(run=cache_evict, client=True)
