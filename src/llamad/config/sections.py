"""The tables a client reads as well as the daemon: ``[daemon]`` and ``[client]``.

Kept apart from :mod:`llamad.config.schema` (the cache's, the models' and the
security tables) so that a client resolving its endpoint loads no cache or
model-worker module (``tests/unit/client/test_client_imports.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import msgspec

from llamad.config.keys import Key, Section, Tables
from llamad.config.kinds import AbsPath, Boolean, Duration, Integer, Number, OneOf, Size, Text

if TYPE_CHECKING:
    from llamad.actors.curve import CurveClient

__all__ = [
    "DEFAULT_HTTP_PORT",
    "DEFAULT_MODEL_ID",
    "ClientSection",
    "DaemonSection",
    "HttpKey",
    "HttpSection",
    "Table",
    "ThreadsSection",
]

DEFAULT_MODEL_ID = "smollm2"
"""The id the default model is served as when no model is configured."""

DEFAULT_HTTP_PORT = 8470
"""The HTTP gateway's port when ``[http] port`` is not set (llama-server's 8080,
vLLM's 8000 and Ollama's 11434 left free, so llamad runs beside any of them)."""


class Table(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of every schema table: frozen, keyword-only."""


_seconds = Duration(positive=True)
_count = Integer(ge=1)


class ThreadsSection(Table, frozen=True, kw_only=True):
    """The daemon-wide thread budget and the thread governor's tuning (SPEC M14)."""

    cores: Annotated[
        int | None,
        Key(
            "The thread budget: CPUs the model workers share. Busy workers each decode on "
            "at most cores // busy_workers threads, so together they never ask for more.",
            _count,
            default_text="every CPU the daemon may run on",
            example=8,
        ),
    ] = None
    collapse_factor: Annotated[
        float,
        Key("A step this many times slower than its recent median is a collapse.", Number(gt=1)),
    ] = 3.0
    collapse_min_s: Annotated[
        float, Key("... and at least this much slower, in seconds.", _seconds)
    ] = 0.005
    window: Annotated[int, Key("Healthy steps a median is taken over.", _count)] = 32
    min_samples: Annotated[
        int, Key("Steps needed before a median is trusted (<= window).", _count)
    ] = 4
    settle_steps: Annotated[
        int, Key("Steps after a thread count change that are not learnt from.", Integer(ge=0))
    ] = 2
    cooldown_s: Annotated[
        float, Key("How long a collapse halves the thread ceiling before a probe.", _seconds)
    ] = 2.0
    cooldown_max_s: Annotated[
        float, Key("Failed probes double the cool-down up to this.", _seconds)
    ] = 60.0
    probe_steps: Annotated[int, Key("Steps a probe (or an exploration) runs.", _count)] = 4
    probe_gain: Annotated[
        float,
        Key(
            "A probe is kept when its median is at most this share of the fallback's.",
            Number(gt=0, le=1),
        ),
    ] = 0.9
    explore_first_s: Annotated[
        float, Key("Delay before the first exploration of fewer threads.", Duration())
    ] = 0.0
    explore_s: Annotated[float, Key("Interval between explorations.", _seconds)] = 30.0
    explore_max_s: Annotated[
        float, Key("Explorations that find nothing double the interval up to this.", _seconds)
    ] = 300.0
    busy_linger_s: Annotated[
        float, Key("A worker still counts as busy this long after its last step.", _seconds)
    ] = 0.5


class DaemonSection(Table, frozen=True, kw_only=True):
    """Where the daemon listens and keeps its files, how it logs."""

    endpoint: Annotated[
        str | None,
        Key(
            "The one client-facing endpoint: ipc://PATH, or tcp://HOST:PORT on a loopback "
            "address (127.0.0.1, ::1, localhost); any address once security.curve_secret_key "
            "is set. With tcp every model worker listens on the same host too.",
            Text(hint="ipc://PATH or tcp://HOST:PORT"),
            default_text="ipc://<runtime_dir>/llamad.sock",
            example="ipc:///run/llamad/llamad.sock",
        ),
    ] = None
    runtime_dir: Annotated[
        str | None,
        Key(
            "Private (0700) directory of sockets, the actor registry, counters and boards.",
            AbsPath(),
            default_text="$LLAMAD_RUNTIME_DIR, else $XDG_RUNTIME_DIR/llamad, "
            "else /tmp/llamad-<uid>",
            example="/run/llamad",
        ),
    ] = None
    state_dir: Annotated[
        str | None,
        Key(
            "Directory of state that outlives a reboot (the disk tier by default).",
            AbsPath(),
            default_text="$STATE_DIRECTORY (systemd), else $XDG_STATE_HOME/llamad, "
            "else ~/.local/state/llamad",
            example="/var/lib/llamad",
        ),
    ] = None
    log_format: Annotated[
        str,
        Key(
            "Log lines on stderr: json, console, or auto (console on a terminal, else json).",
            OneOf(("auto", "json", "console")),
        ),
    ] = "auto"
    log_level: Annotated[
        str,
        Key(
            "Least severe level logged.",
            OneOf(("debug", "info", "warning", "error", "critical")),
        ),
    ] = "info"
    serve_default_model: Annotated[
        bool,
        Key(
            f'With no [models] table, serve the default model as "{DEFAULT_MODEL_ID}" '
            "(false: start with no model; load them at run time).",
            Boolean(),
        ),
    ] = True
    threads: Annotated[ThreadsSection, Section("The thread budget and governor.")] = msgspec.field(
        default_factory=ThreadsSection
    )


class ClientSection(Table, frozen=True, kw_only=True):
    """How a client reaches a daemon served over tcp with CURVE (read by
    ``llamad.Client`` and the ``llamad`` command, never by the daemon)."""

    curve_secret_key: Annotated[
        str | None,
        Key(
            "This client's CURVE secret key file (mode 0600; `llamad keys generate`); "
            "its public key must be among the daemon's security.curve_client_keys.",
            AbsPath(),
            default_text="none: connect without CURVE",
            example="~/.config/llamad/client.key",
        ),
    ] = None
    curve_server_key: Annotated[
        str | None,
        Key(
            "The daemon's CURVE public key file (the .pub beside its secret key).",
            AbsPath(),
            default_text="none",
            example="~/.config/llamad/server.pub",
        ),
    ] = None

    def curve(self) -> CurveClient | None:
        """The keys these files hold (``None``: CURVE off); raises
        :class:`~llamad.actors.errors.ActorConfigError` naming a bad file."""
        from llamad.actors.curve import CurveClient  # noqa: PLC0415 (zmq, only when asked)

        if self.curve_secret_key is None or self.curve_server_key is None:
            return None
        return CurveClient.from_files(self.curve_secret_key, self.curve_server_key)


class HttpKey(Table, frozen=True, kw_only=True):
    """One API key of the HTTP gateway, stored as its SHA-256 (``llamad keys http``
    makes a key and prints its table)."""

    sha256: Annotated[
        str,
        Key(
            "The key's SHA-256, 64 hex digits (the key itself is never stored). A key is "
            "a random token of 32 bytes, so a plain hash resists guessing as well as a "
            "slow one and costs each request microseconds.",
            Text(pattern=r"[0-9a-fA-F]{64}", hint="64 hex digits"),
            required=True,
        ),
    ] = ""
    tenant: Annotated[
        str | None,
        Key(
            "The tenant this key's requests belong to: they carry its cache salt, so no "
            "prompt of one tenant is ever a cache hit for another.",
            Text(pattern=r"[A-Za-z0-9_.-]{1,64}", hint="[A-Za-z0-9_.-], 1 to 64 characters"),
            default_text="none: the shared namespace",
            example="acme",
        ),
    ] = None


class HttpSection(Table, frozen=True, kw_only=True):
    """The HTTP gateway: OpenAI-compatible routes served by a child of the root."""

    enabled: Annotated[bool, Key("Serve HTTP (false: only the ZeroMQ endpoint).", Boolean())] = True
    host: Annotated[
        str,
        Key(
            "The address it binds. A non-loopback address needs at least one key in "
            "http.keys: the daemon refuses to start without.",
            Text(),
        ),
    ] = "127.0.0.1"
    port: Annotated[
        int,
        Key(
            "Its TCP port (0: any free port, published in <runtime_dir>/http.json and "
            "`llamad status`). A port another program holds refuses the start (exit 75).",
            Integer(ge=0, le=65535),
        ),
    ] = DEFAULT_HTTP_PORT
    keys: Annotated[
        dict[str, HttpKey],
        Tables(
            "API keys, one table per name. With any key set every request needs one "
            "(Authorization: Bearer KEY, or x-api-key: KEY), on loopback too.",
            name_hint="<name>",
            example_name="laptop",
            optional=True,
        ),
    ] = msgspec.field(default_factory=dict)
    max_body_bytes: Annotated[
        int, Key("Largest request body; a larger one is refused (413).", Size(ge=1024))
    ] = 8 << 20
    max_streams_per_key: Annotated[
        int,
        Key(
            "Requests one key (or, without keys, all clients together) may run at once; "
            "one more is refused (429).",
            _count,
        ),
    ] = 64
    request_timeout_s: Annotated[
        float,
        Key(
            "Longest wait for a stream's first token (queue and prefill included), and "
            "for the whole answer of a request that is not streamed (504).",
            _seconds,
        ),
    ] = 600.0
    idle_timeout_s: Annotated[
        float, Key("Longest wait between two tokens of a stream (504).", _seconds)
    ] = 60.0
    keepalive_s: Annotated[
        float | None,
        Key(
            "A stream that sent nothing for this long gets an SSE comment (': ping'), so "
            "proxies keep it open; a first token this late starts the stream (200) "
            "before it comes, so a long prefill is pinged too (0 or never: no pings). "
            "Not Ollama's NDJSON streams.",
            Duration(never=True),
        ),
    ] = 15.0
    responses_max_count: Annotated[
        int,
        Key(
            "Most responses of POST /v1/responses kept for previous_response_id and GET "
            "(in <state_dir>/responses, across restarts); the oldest go first.",
            _count,
        ),
    ] = 10_000
    responses_max_bytes: Annotated[
        int,
        Key(
            "Most bytes of stored responses (each is its conversation as text); the "
            "oldest go first.",
            Size(ge=1024),
        ),
    ] = 256 << 20
