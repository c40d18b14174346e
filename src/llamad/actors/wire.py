"""The one wire format of llamad: a versioned msgpack envelope plus binary frames.

A message is a ZeroMQ multipart message::

    [header, blob_0, blob_1, ...]

``header`` is a msgpack array ``[version, kind, cid, op, body]`` (see
:class:`Envelope`); the blobs are raw byte frames that never pass through
msgpack, so large payloads (KV bytes, embeddings) travel without an encode, a
decode or, when sent with ``copy=False``, a copy. On an actor's ROUTER socket
ZeroMQ prepends the peer's routing id, which the runtime strips.

``version`` is always the first element so that a peer of another protocol
version is recognised even when the rest of its envelope has changed shape.
``cid`` (correlation id) is chosen by the client, unique among its open
requests, and echoed by every response; ``0`` is reserved for errors about a
message whose id could not be read. ``op`` names the operation for requests
and is empty in responses. ``body`` is any msgpack value; each op declares the
schema its request body must satisfy (:mod:`llamad.actors.ops`).

Never pickle: msgpack carries only data, so a hostile peer cannot make a
decoder run code.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Annotated, Any, Final, NamedTuple

import msgspec
import zmq

from llamad.actors.errors import ActorConfigError
from llamad.errors import BadRequest, LlamadError, TooLarge, VersionMismatch

__all__ = [
    "CLIENT_KINDS",
    "DECODE_ERRORS",
    "ENVELOPE_DECODER",
    "HANDSHAKE_REQUIRED",
    "MAX_BATCH_EVENTS",
    "MAX_CID",
    "MAX_OP_LEN",
    "MAX_PEER_IDLE_S",
    "MIN_PEER_IDLE_S",
    "PROTOCOL_VERSION",
    "SERVER_KINDS",
    "Blob",
    "Envelope",
    "Hello",
    "Kind",
    "Limits",
    "Message",
    "Rejected",
    "Welcome",
    "decode_body",
    "decode_envelope",
    "encode_envelope",
    "error_body",
    "oversized_blob",
]

PROTOCOL_VERSION: Final = 1
"""Bumped on any incompatible change to the envelope or the handshake."""

MAX_CID: Final = 2**63 - 1
HANDSHAKE_REQUIRED: Final = "handshake_required"
"""``details["reason"]`` of the ``bad_request`` an actor sends to a peer it does
not know (it never said HELLO, or the actor dropped it as stuck or expired it): the request
was not processed, and the client re-handshakes and sends it again."""
MAX_OP_LEN: Final = 64
MIN_PEER_IDLE_S: Final = 0.05
MAX_PEER_IDLE_S: Final = 86_400.0
"""The range of ``Limits.peer_idle_s`` (the shortest ones are for tests)."""
OP_NAME: Final = re.compile(r"^\$?[A-Za-z][A-Za-z0-9_.:-]{0,62}$")
"""Op names: a letter then letters, digits, ``_ . : -``; a leading ``$`` marks runtime ops."""

Blob = bytes | bytearray | memoryview | zmq.Frame
"""Anything that can ride as a binary frame."""


class Kind(IntEnum):
    """What an envelope is. Requests flow client → actor, responses actor → client."""

    CALL = 1  # request; answered by exactly one REPLY or ERROR
    REPLY = 2  # successful answer to a CALL (or HELLO)
    ERROR = 3  # failed answer to a CALL/HELLO, or the terminal error of a STREAM
    CAST = 4  # request without an answer
    STREAM = 5  # request answered by EVENTs then exactly one END or ERROR
    EVENT = 6  # one non-terminal stream event
    END = 7  # terminal, successful end of a stream
    HELLO = 8  # handshake: protocol version and both processes' identities
    CANCEL = 9  # the client gave up on an open CALL or STREAM (cid names it)
    BYE = 10  # the client is closing; the actor forgets it
    PING = 11  # the actor checks a quiet client's connection; cid 0, nothing answers it
    EVENTS = 12  # several EVENTs in one message, in order: cid 0, body [[cid, body], ...]


CLIENT_KINDS: Final = frozenset(
    {Kind.CALL, Kind.CAST, Kind.STREAM, Kind.HELLO, Kind.CANCEL, Kind.BYE}
)
SERVER_KINDS: Final = frozenset(
    {Kind.REPLY, Kind.ERROR, Kind.EVENT, Kind.END, Kind.PING, Kind.EVENTS}
)
MAX_BATCH_EVENTS: Final = 256
"""The most EVENTs an actor folds into one ``EVENTS`` message (it sends the
rest in another): far above one event per stream per tick, small enough
that a batch stays a few KB of header."""


class Envelope(NamedTuple):
    """The header frame of every message, as decoded (``body`` still encoded)."""

    version: int
    kind: int
    cid: Annotated[int, msgspec.Meta(ge=0, le=MAX_CID)]
    op: Annotated[str, msgspec.Meta(max_length=MAX_OP_LEN)]
    body: msgspec.Raw


class Hello(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """Handshake request body: who the client is (for the actor's peer watch)."""

    pid: Annotated[int, msgspec.Meta(ge=1)]
    start_ticks: Annotated[int, msgspec.Meta(ge=0)]
    boot_id: Annotated[str, msgspec.Meta(max_length=64)]
    pidns: Annotated[int, msgspec.Meta(ge=0)]
    name: Annotated[str, msgspec.Meta(max_length=128)] = ""
    batches: bool = False
    """The client reads ``EVENTS`` messages: an actor may then fold the events it
    sends this client within one turn of its loop into one message (see
    :meth:`llamad.actors.outbox.SocketOutbox.batched`). A client that does not
    say so (an older one) gets every event in a message of its own."""


class Welcome(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """Handshake reply body: who the actor is and what it accepts.

    ``instance`` changes on every start of the actor, so a client can tell a
    restarted actor from the one it knew even when the pid is reused.
    """

    name: str
    instance: str
    pid: int
    start_ticks: int
    boot_id: str
    pidns: int
    max_frame_bytes: int
    max_header_bytes: int
    max_blobs: int
    ops: dict[str, str]


@dataclass(frozen=True, slots=True)
class Limits:
    """Size limits and ZeroMQ queue settings of one socket owner.

    ``max_frame_bytes`` is ZeroMQ's ``MAXMSGSIZE``: a peer that sends a bigger
    frame is disconnected by ZeroMQ before the runtime sees anything, so no
    reply is possible; clients check it before sending and raise
    :class:`~llamad.errors.TooLarge` locally. ``max_header_bytes`` is the
    runtime's own cap on the msgpack header (answered with ``too_large``);
    ``0`` (default) means ``min(1 MiB, max_frame_bytes)``.
    ``sndhwm``/``rcvhwm`` bound each peer's ZeroMQ queue in messages; beyond
    that an actor keeps up to ``max_backlog`` more per peer in order, and a
    peer that falls further behind is treated as stuck (its requests are
    cancelled with reason ``backpressure``). ``linger_s`` is how long
    closing waits to flush unsent messages.

    ``peer_idle_s`` and ``max_peers`` bound an actor's clients
    (:mod:`llamad.actors.peers`): a client silent for ``peer_idle_s`` is sent
    a ``PING``, and released (reason ``idle_expired``) when that finds its
    connection gone; a handshake that would make more than ``max_peers``
    clients is refused with ``unavailable``.
    """

    max_frame_bytes: int = 64 * 1024 * 1024
    max_header_bytes: int = 0
    max_blobs: int = 16
    sndhwm: int = 10_000
    rcvhwm: int = 10_000
    max_backlog: int = 100_000
    linger_s: float = 0.2
    peer_idle_s: float = 30.0
    max_peers: int = 10_000

    def __post_init__(self) -> None:
        if self.max_header_bytes == 0 and isinstance(self.max_frame_bytes, int):
            object.__setattr__(self, "max_header_bytes", min(1 << 20, self.max_frame_bytes))
        for name in (
            "max_frame_bytes",
            "max_header_bytes",
            "sndhwm",
            "rcvhwm",
            "max_backlog",
            "max_peers",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ActorConfigError(name, f"must be a positive int, got {value!r}")
        if self.max_frame_bytes > 2**31 - 1:
            raise ActorConfigError("max_frame_bytes", "must fit ZeroMQ's MAXMSGSIZE (< 2 GiB)")
        if self.max_header_bytes > self.max_frame_bytes:
            raise ActorConfigError("max_header_bytes", "must not exceed max_frame_bytes")
        if (
            not isinstance(self.max_blobs, int)
            or isinstance(self.max_blobs, bool)
            or not 0 <= self.max_blobs <= 1024
        ):
            raise ActorConfigError(
                "max_blobs", f"must be an int in 0..1024, got {self.max_blobs!r}"
            )
        if not isinstance(self.linger_s, int | float) or not 0 <= self.linger_s <= 60:
            raise ActorConfigError("linger_s", f"must be seconds in 0..60, got {self.linger_s!r}")
        idle = self.peer_idle_s
        if (
            not isinstance(idle, int | float)
            or isinstance(idle, bool)
            or not MIN_PEER_IDLE_S <= idle <= MAX_PEER_IDLE_S
        ):
            raise ActorConfigError(
                "peer_idle_s",
                f"must be seconds in {MIN_PEER_IDLE_S}..{MAX_PEER_IDLE_S}, got {idle!r}",
            )


@dataclass(frozen=True, slots=True)
class Message:
    """A body plus its binary frames: a reply, an event or a stream's end.

    Handlers return a ``Message`` when their answer carries blobs; clients get
    one from :meth:`~llamad.actors.client.Client.request` and stream
    iteration. Received blobs are ``memoryview``\\ s over ZeroMQ's buffers.
    """

    body: Any = None
    blobs: tuple[Blob, ...] = ()


class Rejected(Exception):
    """Internal: an inbound header failed validation.

    ``cid`` and ``kind`` are what could be salvaged from the bytes (``0`` and
    ``None`` when unreadable), so the receiver can still address an error reply
    and knows whether the sender expects one.
    """

    def __init__(self, error: LlamadError, cid: int = 0, kind: int | None = None) -> None:
        super().__init__(error.message)
        self.error = error
        self.cid = cid
        self.kind = kind


DECODE_ERRORS: Final = (msgspec.DecodeError, RecursionError, UnicodeDecodeError, ValueError)
"""What msgspec can raise on hostile bytes: besides ``DecodeError``, invalid
UTF-8 in a str surfaces as ``UnicodeDecodeError`` and deep nesting as
``RecursionError``."""

_ENCODER: Final = msgspec.msgpack.Encoder()
ENVELOPE_DECODER: Final = msgspec.msgpack.Decoder(Envelope)
"""Decodes a header frame into an :class:`Envelope` and nothing more; hot
paths use it directly and hand anything unexpected to :func:`decode_envelope`,
which does every check and says what is wrong."""


def encode_envelope(kind: int, cid: int, op: str, body: Any) -> bytes:
    """Encode one header frame; raises :class:`~llamad.errors.BadRequest` if
    ``body`` holds what msgpack cannot carry: a string that is not Unicode
    text (a lone surrogate: what Python makes of bytes that are not UTF-8 in
    a command line, a file name or a pipe), an int outside -2**63..2**64-1,
    or an object of a type it has no form for."""
    try:
        return _ENCODER.encode((PROTOCOL_VERSION, kind, cid, op, body))
    except (OverflowError, TypeError, msgspec.EncodeError) as exc:
        raise BadRequest(
            f"{op or 'the message'}: a value that cannot be sent ({exc})",
            details={"op": op, "error": str(exc)},
        ) from None
    except UnicodeEncodeError as exc:
        bad = exc.object[exc.start : exc.end]
        code = f"U+{ord(bad[0]):04X}" if bad else "?"
        raise BadRequest(
            f"{op or 'the message'}: text that is not valid Unicode (a lone surrogate, "
            f"{code}, at character {exc.start}: bytes that are not UTF-8?)",
            details={"op": op, "position": exc.start},
        ) from None


def decode_envelope(
    header: bytes | memoryview, max_header_bytes: int, accept: frozenset[Kind]
) -> Envelope:
    """Validate and decode one header frame; raise :class:`Rejected` otherwise.

    Checks, in order: size, msgpack well-formedness and exact shape (5
    elements, typed), protocol version, and that the kind is one this side
    accepts. The body stays encoded (``msgspec.Raw``) for the per-op decoder.
    """
    size = len(header)
    if size > max_header_bytes:
        ints = _peek_ints(header)
        raise Rejected(
            TooLarge(
                f"header of {size} bytes exceeds {max_header_bytes}",
                details={"limit": max_header_bytes, "size": size},
            ),
            *_salvage(ints),
        )
    try:
        env = ENVELOPE_DECODER.decode(header)
    except DECODE_ERRORS as exc:
        ints = _peek_ints(header)
        if ints and ints[0] != PROTOCOL_VERSION:
            raise _version_mismatch(ints[0], ints) from None
        raise Rejected(BadRequest(f"malformed envelope: {exc}"), *_salvage(ints)) from None
    if env.version != PROTOCOL_VERSION:
        raise _version_mismatch(env.version, [env.version, env.kind, env.cid])
    # Kind is an IntEnum: a plain int finds its member in ``accept``.
    if env.kind not in accept:
        raise Rejected(BadRequest(f"unexpected message kind {env.kind}"), env.cid, env.kind)
    return env


def decode_body(raw: msgspec.Raw, decoder: msgspec.msgpack.Decoder[Any]) -> Any:
    """Decode a request body against its op's schema; ``BadRequest`` on mismatch."""
    try:
        return decoder.decode(raw)
    except msgspec.ValidationError as exc:
        raise BadRequest(f"invalid body: {exc}") from None
    except DECODE_ERRORS as exc:
        raise BadRequest(f"malformed body: {exc}") from None


def error_body(error: LlamadError) -> dict[str, Any]:
    """The wire form of an error, degraded to strings if its details won't encode."""
    payload = error.to_wire()
    try:
        _ENCODER.encode(payload)
    except (TypeError, msgspec.EncodeError, OverflowError):
        payload["details"] = {str(k): repr(v) for k, v in error.details.items()}
    return payload


def oversized_blob(blobs: Sequence[Blob], max_frame_bytes: int) -> int | None:
    """Index of the first blob larger than ``max_frame_bytes``, or ``None``."""
    for i, blob in enumerate(blobs):
        if type(blob) is bytes or isinstance(blob, zmq.Frame):
            size = len(blob)
        else:
            size = memoryview(blob).nbytes
        if size > max_frame_bytes:
            return i
    return None


def _version_mismatch(theirs: int, ints: list[int]) -> Rejected:
    return Rejected(
        VersionMismatch(
            f"protocol version {theirs} is not supported (this side speaks {PROTOCOL_VERSION})",
            details={"expected": PROTOCOL_VERSION, "got": theirs},
        ),
        *_salvage(ints),
    )


def _salvage(ints: list[int]) -> tuple[int, int | None]:
    cid = ints[2] if len(ints) > 2 and 0 <= ints[2] <= MAX_CID else 0
    kind = ints[1] if len(ints) > 1 else None
    return cid, kind


def _peek_ints(buf: bytes | memoryview) -> list[int]:
    """The leading integer elements (at most 3) of a msgpack array, without
    decoding the rest: enough to address an error about a message that is
    otherwise unreadable or too large to decode."""
    data = bytes(buf[:32])
    if not data:
        return []
    head = data[0]
    if 0x90 <= head <= 0x9F:
        pos = 1
    elif head == 0xDC:
        pos = 3
    elif head == 0xDD:
        pos = 5
    else:
        return []
    out: list[int] = []
    while len(out) < 3 and pos < len(data):
        tag = data[pos]
        if tag <= 0x7F:
            out.append(tag)
            pos += 1
        elif tag >= 0xE0:
            out.append(tag - 0x100)
            pos += 1
        elif tag in _INT_WIDTHS:
            width, signed = _INT_WIDTHS[tag]
            chunk = data[pos + 1 : pos + 1 + width]
            if len(chunk) < width:
                break
            out.append(int.from_bytes(chunk, "big", signed=signed))
            pos += 1 + width
        else:
            break
    return out


_INT_WIDTHS: Final = {
    0xCC: (1, False),
    0xCD: (2, False),
    0xCE: (4, False),
    0xCF: (8, False),
    0xD0: (1, True),
    0xD1: (2, True),
    0xD2: (4, True),
    0xD3: (8, True),
}
