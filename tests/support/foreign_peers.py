"""Clients that introduce themselves as processes of another host (issue 17).

An actor watches a client's process only when the HELLO names one on its own
host (same boot id and pid namespace); these name another boot id, so what
releases them once gone is the actor's idle check, as for a real remote
client.

- :class:`ForeignClient`: the real actors client, with that HELLO;
- :func:`foreign_dealer`: a bare DEALER that has completed such a handshake
  (to close without ``BYE``);
- as a script, a remote client that makes one call and idles until killed::

      python foreign_peers.py ENDPOINT [CLIENT_SECRET SERVER_PUBLIC]

  prints ``READY`` once its call was answered (CURVE when the key files are
  given), then, for each line ``call`` on its stdin, calls again and prints
  ``ANSWERED`` (at EOF it just idles).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

import msgspec
import zmq

from llamad.actors import Client
from llamad.actors.connection import CLIENT_LIMITS, Slot, dealer
from llamad.actors.curve import CurveClient
from llamad.actors.wire import PROTOCOL_VERSION, Hello, Kind, encode_envelope

__all__ = ["OTHER_HOST", "ForeignClient", "foreign_dealer"]

OTHER_HOST = "0e5c1d9a-0000-4000-8000-another-host"
"""A boot id that is not this machine's."""

_ANY = msgspec.msgpack.Decoder()


class ForeignClient(Client):
    """The real client, introducing itself as a process of another host."""

    def _hello(self) -> tuple[int, Slot, bytes]:
        cid, slot, _ = super()._hello()
        hello = Hello(os.getpid(), 1, OTHER_HOST, 1, self.client_name)
        return cid, slot, encode_envelope(Kind.HELLO, cid, "", hello)


def foreign_dealer(
    ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str, tag: int, curve: CurveClient | None = None
) -> Any:
    """A DEALER (CURVE with ``curve``) that has completed a handshake as process
    ``100000 + tag`` of another host; the caller closes it."""
    sock = dealer(ctx, endpoint, CLIENT_LIMITS, curve)
    sock.setsockopt(zmq.RCVTIMEO, 60_000)
    sock.connect(endpoint)
    hello = Hello(100_000 + tag, tag, OTHER_HOST, 1, f"churn-{tag}")
    sock.send(msgspec.msgpack.encode([PROTOCOL_VERSION, Kind.HELLO, 1, "", hello]))
    version, kind, cid, _, _ = _ANY.decode(sock.recv())
    assert (version, kind, cid) == (PROTOCOL_VERSION, Kind.REPLY, 1)
    return sock


def main() -> None:
    endpoint, *keys = sys.argv[1:]
    curve = CurveClient.from_files(keys[0], keys[1]) if keys else None
    client = ForeignClient(
        endpoint, curve=curve, timeout=60, connect_timeout=60, client_name="remote-child"
    )
    client.call("$ping")
    print("READY", flush=True)
    for line in sys.stdin:
        if line.strip() == "call":
            client.call("$ping")
            print("ANSWERED", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
