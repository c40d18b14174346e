"""``llamad keys generate``: a CURVE keypair for serving (or reaching) a daemon over tcp;
``llamad keys http``: an API key for the HTTP gateway.

::

    llamad keys generate NAME [--dir DIR]
    llamad keys http NAME [--tenant TENANT]

writes ``DIR/NAME.key`` (the secret key, mode 0600) and ``DIR/NAME.pub``
(the public key), Z85 text (:func:`llamad.actors.curve.write_keypair`), and
prints where they are and which configuration keys take them. An existing
file is never replaced: a key that clients or the daemon trust must not
change under them. Works without a daemon.

``keys http`` prints a new random key (32 bytes, ``sk-llamad-`` and 43
URL-safe characters) once, and the ``[http.keys.NAME]`` table that admits it:
the config holds only the key's SHA-256 (``docs/internals/gateway.md``).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any, Final

from llamad.cli.errors import EXIT_ERROR, EXIT_OK, EXIT_USAGE

__all__ = ["add_commands", "generate", "http_key"]

_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def generate(args: argparse.Namespace) -> int:
    from llamad.actors.curve import write_keypair  # noqa: PLC0415 (loads ZeroMQ)

    if not _NAME.fullmatch(args.name):
        sys.stderr.write(
            f"llamad: usage: {args.name!r} is not a key name (a letter or digit, then "
            "letters, digits, '_', '.', '-')\n"
        )
        return EXIT_USAGE
    folder = Path(args.dir).expanduser().resolve()
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        secret, public = write_keypair(folder, args.name)
    except OSError as exc:
        sys.stderr.write(f"llamad: keys: {exc}\n")
        return EXIT_ERROR
    key = public.read_text().strip()
    sys.stdout.write(
        f"secret key  {secret}  (mode 0600: keep it private)\n"
        f"public key  {public}  {key}\n"
        "\n"
        "for the daemon:  [security] curve_secret_key = the .key, and every client's .pub\n"
        "                 in curve_client_keys (a file or a directory of .pub files)\n"
        "for a client:    [client] curve_secret_key = the .key,\n"
        "                 curve_server_key = the daemon's .pub\n"
    )
    return EXIT_OK


def http_key(args: argparse.Namespace) -> int:
    import hashlib  # noqa: PLC0415
    import secrets  # noqa: PLC0415

    for what, value in (("key", args.name), ("tenant", args.tenant)):
        if value is not None and not _NAME.fullmatch(value):
            sys.stderr.write(
                f"llamad: usage: {value!r} is not a {what} name (a letter or digit, then "
                "letters, digits, '_', '.', '-')\n"
            )
            return EXIT_USAGE
    key = "sk-llamad-" + secrets.token_urlsafe(32)
    digest = hashlib.sha256(key.encode()).hexdigest()
    table = f'[http.keys.{args.name}]\nsha256 = "{digest}"\n'
    if args.tenant is not None:
        table += f'tenant = "{args.tenant}"\n'
    sys.stdout.write(
        f"key  {key}\n"
        "     (shown once: give it to the client; the daemon keeps only its hash)\n"
        "\n"
        f"for the daemon's config:\n\n{table}"
    )
    return EXIT_OK


def add_commands(commands: Any) -> None:
    """Register ``keys generate`` on the ``llamad`` command's subparsers."""
    keys = commands.add_parser(
        "keys", help="CURVE keys for serving the daemon over tcp; API keys for HTTP"
    )
    actions = keys.add_subparsers(dest="action", required=True, metavar="ACTION")
    gen = actions.add_parser(
        "generate", help="write a new keypair: NAME.key (secret, 0600) and NAME.pub"
    )
    gen.add_argument("name", metavar="NAME", help="the files' name: server, or a client's name")
    gen.add_argument(
        "--dir", default=".", metavar="DIR", help="where to write them (default: here)"
    )
    gen.set_defaults(run=generate)
    http = actions.add_parser(
        "http", help="make an API key for the HTTP gateway and print its [http.keys] table"
    )
    http.add_argument("name", metavar="NAME", help="the key's name in the config")
    http.add_argument(
        "--tenant", metavar="TENANT", help="the tenant whose cache namespace its requests use"
    )
    http.set_defaults(run=http_key)
