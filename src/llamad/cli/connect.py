"""What the ``llamad`` client commands share: the connection and their arguments.

Every command that talks to the daemon goes through the public
:class:`llamad.Client`, built from the global options (``--endpoint``,
``--config``, ``--timeout``, ``--connect-timeout``). The argument parsers
here are pure (tested in ``tests/unit/cli``).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any, Final

from llamad.client.sync import Client
from llamad.config.env import parse_env_value
from llamad.errors import ModelNotFound

__all__ = [
    "DEFAULT_CONNECT_TIMEOUT",
    "UsageError",
    "connect",
    "parse_key",
    "parse_options",
    "pick_model",
]

DEFAULT_CONNECT_TIMEOUT: Final = 3.0
"""Seconds a command waits for the daemon to answer before it says none runs.
Shorter than the library's default (10 s): a person at a prompt wants the
hint quickly; ``--connect-timeout`` raises it for scripts that start the
daemon just before."""


class UsageError(Exception):
    """A command line that cannot be carried out (exit 2, like argparse's own)."""


def connect(args: argparse.Namespace) -> Client:
    """The client the global options describe."""
    kwargs: dict[str, Any] = {
        "config": args.config,
        "connect_timeout": args.connect_timeout,
        "name": "llamad-cli",
    }
    if args.timeout is not None:
        kwargs["timeout"] = args.timeout
    return Client(args.endpoint, **kwargs)


def pick_model(client: Client, model: str | None) -> str:
    """``model``, else the one model the daemon serves (a person with one
    model need not name it)."""
    if model:
        return model
    models = sorted(m.model_id for m in client.list_models())
    if not models:
        raise ModelNotFound("the daemon serves no model: load one with `llamad load MODEL PATH`")
    if len(models) > 1:
        raise UsageError(f"the daemon serves {', '.join(models)}: name one with --model")
    return models[0]


def parse_options(pairs: Iterable[str]) -> dict[str, Any]:
    """``KEY=VALUE`` pairs into options: each value read as a TOML value when it
    is one (``8``, ``true``, ``0.5``, ``["a", "b"]``), else as a string — the
    same reading as the ``LLAMAD_*`` environment overrides."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"expected KEY=VALUE, got {pair!r}")
        options[key.replace("-", "_")] = parse_env_value(value)
    return options


def parse_key(text: str) -> bytes:
    """A cache key given in hex (as ``--json`` prints ``finish_key``)."""
    try:
        key = bytes.fromhex(text)
    except ValueError:
        raise UsageError(f"a cache key is 64 hex digits, got {text!r}") from None
    if len(key) != 32:
        raise UsageError(f"a cache key is 64 hex digits, got {len(text)} characters")
    return key
