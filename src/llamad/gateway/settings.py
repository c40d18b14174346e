"""What the gateway process is started with (its boot record, built by the daemon's tree)."""

from __future__ import annotations

import msgspec

from llamad.config.sections import HttpSection

__all__ = ["GatewaySettings"]


class GatewaySettings(msgspec.Struct, frozen=True, kw_only=True):
    """``http``: the ``[http]`` table; ``endpoint``: the daemon's client-facing
    endpoint (the gateway is a client of it); ``runtime_dir``: where it
    publishes its address; ``port``: the port to bind, which the root chose
    when ``http.port`` is 0 (so a restarted gateway keeps it)."""

    http: HttpSection
    endpoint: str
    runtime_dir: str
    port: int
