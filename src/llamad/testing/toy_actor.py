"""A toy actor for tests, benchmarks and demos of the runtime.

Run it as its own process (spawn/exec semantics, like a supervised child)::

    python -m llamad.testing.toy_actor --name toy --registry DIR
    python -m llamad.testing.toy_actor --endpoint tcp://127.0.0.1:0 --no-register

It prints ``READY <endpoint> <pid>`` on stdout once it serves, and exercises
every serving style: immediate replies (``echo``, ``fail``, ``refuse``),
blocking work (``sleep``), deferred replies answered from the loop (``wait``
+ ``publish``, ``hang``), synchronous streams (``count``), streams pushed
across loop iterations (``ticks``) and one that stays open without events
(``hold``), plus cancellation bookkeeping (``cancels``).
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import select
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import msgspec

from llamad import logs
from llamad.actors.actor import Actor
from llamad.actors.client import Client
from llamad.actors.handles import PendingReply, Request, StreamSender
from llamad.actors.ops import OpKind, OpSpec
from llamad.actors.registry import Registry
from llamad.actors.wire import Limits, Message
from llamad.errors import StickyBusy

__all__ = [
    "Count",
    "Sleep",
    "Ticks",
    "ToyProcess",
    "Wait",
    "build_toy",
    "client_workload",
    "main",
    "spawn_toy",
]


class Sleep(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    s: Annotated[float, msgspec.Meta(ge=0, le=60)]


class Count(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    n: Annotated[int, msgspec.Meta(ge=0, le=100_000_000)]
    size: Annotated[int, msgspec.Meta(ge=0, le=1 << 20)] = 0


class Ticks(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    n: Annotated[int, msgspec.Meta(ge=0, le=1_000_000)]
    interval: Annotated[float, msgspec.Meta(ge=0, le=10)] = 0.0


class Wait(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    key: Annotated[str, msgspec.Meta(max_length=64)]
    timeout: Annotated[float, msgspec.Meta(ge=0, le=60)]


class Publish(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    key: Annotated[str, msgspec.Meta(max_length=64)]
    value: Any = None


class _Toy:
    """State of the toy actor: waiters, pushed streams, observed cancels."""

    def __init__(self, actor: Actor) -> None:
        self.actor = actor
        self.waiters: dict[str, list[PendingReply]] = defaultdict(list)
        self.ticking: list[tuple[StreamSender, int, float, list[int]]] = []
        self.cancels: list[str] = []
        self.hung: list[PendingReply] = []

    def echo(self, req: Request[Any]) -> Message:
        return Message(req.body, req.blobs)

    def fail(self, req: Request[Any]) -> None:
        raise ValueError("boom")

    def refuse(self, req: Request[Any]) -> None:
        raise StickyBusy("sequence busy", details={"session": "s1"})

    def sleep(self, req: Request[Sleep]) -> float:
        time.sleep(req.body.s)
        return req.body.s

    def hang(self, req: Request[Any]) -> None:
        pending = req.defer()
        pending.on_cancel(self.cancels.append)
        self.hung.append(pending)

    def hold(self, req: Request[Any]) -> None:
        req.stream().on_cancel(self.cancels.append)

    def wait(self, req: Request[Wait]) -> None:
        pending = req.defer(timeout=req.body.timeout, on_timeout=lambda: {"hit": False})
        pending.on_cancel(self.cancels.append)
        self.waiters[req.body.key].append(pending)

    def publish(self, req: Request[Publish]) -> None:
        for pending in self.waiters.pop(req.body.key, []):
            pending.reply({"hit": True, "value": req.body.value})

    def count(self, req: Request[Count]) -> Any:
        payload = b"x" * req.body.size
        for i in range(req.body.n):
            yield Message({"i": i}, (payload,)) if payload else {"i": i}
        return {"n": req.body.n}

    def ticks(self, req: Request[Ticks]) -> None:
        sender = req.stream()
        sender.on_cancel(self.cancels.append)
        self.ticking.append((sender, req.body.n, req.body.interval, [0]))

    def get_cancels(self, req: Request[Any]) -> list[str]:
        return self.cancels

    def pid(self, req: Request[Any]) -> int:
        return os.getpid()

    def tick(self) -> float | None:
        """Push one event to every open ``ticks`` stream; return the next wait."""
        now = time.monotonic()
        keep = []
        for sender, n, interval, sent in self.ticking:
            if sender.done:
                continue
            if sent[0] >= n:
                sender.end({"n": n})
                continue
            sender.emit({"i": sent[0], "t": now})
            sent[0] += 1
            keep.append((sender, n, interval, sent))
        self.ticking = keep
        if not keep:
            return None
        return min(interval for _, _, interval, _ in keep)


def build_toy(actor: Actor) -> _Toy:
    """Declare the toy ops on ``actor``; return the toy's state."""
    toy = _Toy(actor)
    actor.add_op(OpSpec("echo", OpKind.CALL, body=Any, max_blobs=4), toy.echo)
    actor.add_op(OpSpec("fail", OpKind.CALL), toy.fail)
    actor.add_op(OpSpec("refuse", OpKind.CALL), toy.refuse)
    actor.add_op(OpSpec("sleep", OpKind.CALL, body=Sleep), toy.sleep)
    actor.add_op(OpSpec("hang", OpKind.CALL), toy.hang)
    actor.add_op(OpSpec("hold", OpKind.STREAM), toy.hold)
    actor.add_op(OpSpec("wait", OpKind.CALL, body=Wait), toy.wait)
    actor.add_op(OpSpec("publish", OpKind.CAST, body=Publish), toy.publish)
    actor.add_op(OpSpec("count", OpKind.STREAM, body=Count), toy.count)
    actor.add_op(OpSpec("ticks", OpKind.STREAM, body=Ticks), toy.ticks)
    actor.add_op(OpSpec("cancels", OpKind.CALL), toy.get_cancels)
    actor.add_op(OpSpec("pid", OpKind.CALL), toy.pid)
    actor.add_op(OpSpec("fail_cast", OpKind.CAST), toy.fail)
    return toy


def run_toy(actor: Actor, toy: _Toy, ready: Callable[[], None] | None = None) -> None:
    """The toy's loop: serve requests and push ``ticks`` events between polls.

    ``ready`` runs once SIGTERM/SIGINT are wired to a clean stop, before the
    first poll (so a stop sent right after the announcement is not lost).
    """
    restore = actor.stop_on_signals()
    try:
        if ready is not None:
            ready()
        wait: float | None = None
        while not actor.stop_requested:
            actor.poll(wait)
            wait = toy.tick()
    finally:
        restore()
        actor.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--name", default="toy")
    parser.add_argument("--endpoint")
    parser.add_argument("--registry", type=Path)
    parser.add_argument("--no-register", action="store_true")
    parser.add_argument("--max-frame-bytes", type=int, default=Limits().max_frame_bytes)
    parser.add_argument("--peer-idle-s", type=float, default=Limits().peer_idle_s)
    args = parser.parse_args(argv)
    # stdout carries the READY line; logs go to stderr.
    logs.configure()
    # A toy that hangs in a test can be asked where it is.
    faulthandler.register(signal.SIGUSR1)
    registry = Registry(args.registry) if args.registry else None
    actor = Actor(
        args.name,
        endpoint=args.endpoint,
        registry=registry,
        register=not args.no_register,
        limits=Limits(max_frame_bytes=args.max_frame_bytes, peer_idle_s=args.peer_idle_s),
    )
    toy = build_toy(actor)
    endpoint = actor.start()
    run_toy(actor, toy, lambda: print(f"READY {endpoint} {os.getpid()}", flush=True))
    return 0


def client_workload(endpoint: str, calls: int, events: int, tag: int = 0) -> dict[str, Any]:
    """Run in a client process: ``calls`` echo calls and one ``events`` stream.

    Returns what came back, for the caller to check (used by the multi-client
    tests and the benchmark).
    """
    with Client(endpoint, timeout=60, client_name=f"load-{tag}") as client:
        echoed = [client.call("echo", {"tag": tag, "i": i})["i"] for i in range(calls)]
        stream = client.stream("count", {"n": events})
        seen = [m.body["i"] for m in stream]
        return {"echoed": echoed, "seen": seen, "result": stream.result}


class ToyProcess:
    """A toy actor running as a child process (see :func:`spawn_toy`)."""

    def __init__(self, proc: subprocess.Popen[str], endpoint: str, pid: int) -> None:
        self.proc = proc
        self.endpoint = endpoint
        self.pid = pid

    def kill(self) -> None:
        """SIGKILL and reap."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM, wait (SIGKILL after ``timeout``), reap; return the exit code."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                return self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGUSR1)  # stacks to stderr, for the log
                time.sleep(0.5)
                self.proc.kill()
        return self.proc.wait()

    def __enter__(self) -> ToyProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


def spawn_toy(*args: str, ready_timeout: float = 30.0) -> ToyProcess:
    """Start ``python -m llamad.testing.toy_actor ARGS`` and wait for READY."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "llamad.testing.toy_actor", *args],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + ready_timeout
    while True:
        left = deadline - time.monotonic()
        ready, _, _ = select.select([proc.stdout], [], [], max(0.0, left))
        line = proc.stdout.readline() if ready else ""
        if line.startswith("READY "):
            _, endpoint, pid = line.split()
            return ToyProcess(proc, endpoint, int(pid))
        if not ready or not line:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"toy actor did not start (exit {proc.returncode})")


if __name__ == "__main__":
    sys.exit(main())
