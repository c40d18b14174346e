"""``llamad metrics``: the daemon's metrics, as a Prometheus scrape would read them.

Prints the exposition text (format 0.0.4, :mod:`llamad.client.prometheus`)
of one ``metrics`` read of the front: every model's request counts and
latency histograms from its worker's status board, the cache's counters and
tiers. ``--json``: the snapshot itself (:class:`~llamad.front.wire.MetricsSnapshot`).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from llamad.cli import render
from llamad.client.prometheus import exposition
from llamad.client.sync import Client

__all__ = ["add_commands"]


def metrics(args: argparse.Namespace, client: Client) -> int:
    snapshot = client.metrics()
    sys.stdout.write(render.to_json(snapshot) if args.json else exposition(snapshot))
    sys.stdout.flush()
    return 0


def add_commands(commands: Any, common: argparse.ArgumentParser) -> None:
    """Register ``metrics`` on ``commands`` (argparse's subparsers action)."""
    help_ = "the daemon's metrics in Prometheus's text format"
    p: argparse.ArgumentParser = commands.add_parser(
        "metrics", help=help_, description=help_, parents=[common]
    )
    p.add_argument("--json", action="store_true", help="print the snapshot as JSON for scripts")
    p.set_defaults(run=metrics, client=True)
