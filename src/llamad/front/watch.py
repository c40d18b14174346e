"""Following ``model_sup``'s decisions from the front (:mod:`llamad.supervisor.events`).

:class:`SupervisorWatch` is a thread subscribed to a supervisor service's
``events`` stream; each event is posted to the front's loop. It keeps the
``seq`` of the last event it passed on, so a subscription that ends (its
periodic timeout, which lets the thread see a stop request) resumes after
it without losing or repeating an event.

A supervisor that restarts numbers its events from 1 again and has lost its
dynamic children: the watch tells the two apart by the service actor's
``instance`` in the registry, and then posts :meth:`on_restart` (the front
reconciles its table: every model that should run is loaded again) and
follows the new process from its first event.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from typing import Final

import structlog

from llamad.actors import Registry
from llamad.errors import LlamadError, RequestTimeout
from llamad.front.lanes import Mailbox
from llamad.supervisor.events import SupervisorEvent
from llamad.supervisor.service import SupervisorClient

__all__ = ["SupervisorWatch"]

log = structlog.get_logger("llamad.front")

_WAIT_S: Final = 1.0  # longest wait for an event before looking at the stop flag
_RETRY_S: Final = 0.2  # between attempts while the supervisor is not reachable


class SupervisorWatch:
    """Post ``service``'s events to ``on_event`` (on the loop), and ``on_restart``
    when the supervisor behind it is a new process."""

    def __init__(
        self,
        service: str,
        registry: Registry,
        mailbox: Mailbox,
        on_event: Callable[[SupervisorEvent], None],
        on_restart: Callable[[], None],
    ) -> None:
        self.service = service
        self.registry = registry
        self._mailbox = mailbox
        self._on_event = on_event
        self._on_restart = on_restart
        self._stop = threading.Event()
        self._started_at = time.time()
        self._thread = threading.Thread(target=self._run, name=f"front-watch-{service}")
        self._thread.daemon = True

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _instance(self) -> str | None:
        entry = self.registry.lookup(self.service)
        return None if entry is None else entry.instance

    def _run(self) -> None:
        # From the first event the supervisor keeps, passing on only those
        # since the watch started: the front read the state before that from
        # which_children. (Subscribing for "new events only" again after a
        # quiet timeout would lose what happened in between.)
        instance = self._instance()
        last: int | None = 0
        client = SupervisorClient(self.service, registry=self.registry)
        try:
            while not self._stop.is_set():
                now = self._instance()
                if now is None:
                    self._stop.wait(_RETRY_S)
                    continue
                if instance is not None and now != instance:
                    log.info("front.supervisor_restarted", supervisor=self.service)
                    self._mailbox.post(self._on_restart)
                    last = 0
                instance = now
                last = self._follow(client, last)
        finally:
            client.close()

    def _follow(self, client: SupervisorClient, since: int | None) -> int | None:
        """One subscription: pass events on until it ends; the last ``seq`` passed."""
        try:
            with client.subscribe(since=since, timeout=_WAIT_S) as events:
                for event in events:
                    since = event.seq
                    if event.at < self._started_at:
                        continue
                    self._mailbox.post(functools.partial(self._on_event, event))
                    if self._stop.is_set():
                        break
        except RequestTimeout:
            pass  # quiet for a while: look at the stop flag, then subscribe again
        except LlamadError as exc:  # the supervisor died or is restarting
            log.debug("front.watch_interrupted", supervisor=self.service, error=exc.code)
            self._stop.wait(_RETRY_S)
        return since
