"""An actor served from a thread of the test process (fast actor tests, no children)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from llamad.actors import Actor

__all__ = ["running"]


@contextmanager
def running(actor: Actor, tick: Callable[[], object] | None = None) -> Iterator[Actor]:
    """Serve ``actor`` on a thread that owns its sockets, calling ``tick``
    between polls; stop it on exit, and fail if its loop raised."""
    started = threading.Event()
    errors: list[BaseException] = []

    def loop() -> None:
        try:
            actor.start()
            started.set()
            while not actor.stop_requested:
                actor.poll(0.01 if tick else 0.5)
                if tick:
                    tick()
        except BaseException as exc:
            errors.append(exc)
        finally:
            started.set()
            actor.close()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    assert started.wait(20)
    try:
        yield actor
    finally:
        actor.request_stop()
        thread.join(20)
        assert not thread.is_alive()
        assert not errors, errors
