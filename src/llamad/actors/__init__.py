"""The actor runtime: every llamad process is an actor reached over ZeroMQ.

Public API (everything else in the package is internal):

Serving (:mod:`llamad.actors.actor`, :mod:`llamad.actors.handles`)::

    actor = Actor("cache-meta")                      # ipc endpoint from the registry
    actor.add_op(OpSpec("lookup", OpKind.CALL, body=Lookup), handler)
    @actor.op("echo")                                # decorator form
    def echo(req: Request[dict[str, Any]]) -> Any: return req.body
    actor.serve_forever()                            # SIGTERM/SIGINT stop it cleanly
    # or, in a loop that does other work:
    actor.start(); restore = actor.stop_on_signals()
    while not actor.stop_requested: actor.poll(0 or timeout); ...   # tick
    actor.wake()                                     # from other threads/signals
    actor.add_reader(fd, callback)                   # more fds in the same poll

    handler(req) -> body | Message(body, blobs)      # immediate reply
    pending = req.defer(timeout=0.5, on_timeout=f)   # answer later: pending.reply()/fail()
    sender = req.stream()                            # stream later: emit()... end()/fail()
    handler(req) -> iterator                         # stream now: events, return = end body
    actor.on_peer_down(cb)                           # a client closed, died or vanished

Calling (:mod:`llamad.actors.client`)::

    c = Client(name="cache-meta")  # or Client("ipc:///run/llamad/x.sock")
    c.call("lookup", {"keys": [...]}, timeout=1.0) -> body      # raises the typed error
    c.request(op, body, blobs=[...]) -> Message(body, blobs)
    c.cast(op, body)
    for event in c.stream(op, body): ...                        # Message per event
    c.close()

Errors travel as ``LlamadError.to_wire()`` and are raised on the client as the
same class (:func:`llamad.errors.from_wire`). A caller whose actor dies gets
:class:`~llamad.errors.WorkerCrashed` within about 0.1 s (the client checks the
actor's pidfd that often while it waits); see ``docs/internals/actors.md``.

Monitors and names: :class:`ProcessRef`/:class:`ProcessWatch` (pidfd-based
"tell me when this process dies"), :class:`Registry` (names → endpoints,
following restarts).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llamad._lazy import lazy_face

if TYPE_CHECKING:
    from llamad.actors.actor import Actor, ActorStats, Handler
    from llamad.actors.client import Client, StreamCall
    from llamad.actors.errors import ActorConfigError, ClientClosed, NameTaken, WrongProcess
    from llamad.actors.handles import Peer, PendingReply, Request, StreamSender
    from llamad.actors.monitor import ProcessRef, ProcessWatch
    from llamad.actors.ops import OpKind, OpSpec
    from llamad.actors.registry import Registry, RegistryEntry, runtime_dir
    from llamad.actors.wire import PROTOCOL_VERSION, Kind, Limits, Message, Welcome

__getattr__, __dir__ = lazy_face(
    __name__,
    {
        "llamad.actors.actor": (
            "Actor",
            "ActorStats",
            "Handler",
        ),
        "llamad.actors.client": (
            "Client",
            "StreamCall",
        ),
        "llamad.actors.errors": (
            "ActorConfigError",
            "ClientClosed",
            "NameTaken",
            "WrongProcess",
        ),
        "llamad.actors.handles": (
            "Peer",
            "PendingReply",
            "Request",
            "StreamSender",
        ),
        "llamad.actors.monitor": (
            "ProcessRef",
            "ProcessWatch",
        ),
        "llamad.actors.ops": (
            "OpKind",
            "OpSpec",
        ),
        "llamad.actors.registry": (
            "Registry",
            "RegistryEntry",
            "runtime_dir",
        ),
        "llamad.actors.wire": (
            "PROTOCOL_VERSION",
            "Kind",
            "Limits",
            "Message",
            "Welcome",
        ),
    },
)

__all__ = [
    "PROTOCOL_VERSION",
    "Actor",
    "ActorConfigError",
    "ActorStats",
    "Client",
    "ClientClosed",
    "Handler",
    "Kind",
    "Limits",
    "Message",
    "NameTaken",
    "OpKind",
    "OpSpec",
    "Peer",
    "PendingReply",
    "ProcessRef",
    "ProcessWatch",
    "Registry",
    "RegistryEntry",
    "Request",
    "StreamCall",
    "StreamSender",
    "Welcome",
    "WrongProcess",
    "runtime_dir",
]
