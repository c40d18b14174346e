"""Process entry points: a supervisor as a child process, and a root supervisor.

``run_supervisor_process`` is the ``start`` target of every nested supervisor
(see :func:`llamad.supervisor.spec.supervisor_child`): the child runner calls
it in a fresh interpreter, it runs the supervisor loop in the main thread, and
it reports ready to its own parent only after all of its children started, so
start order holds across the levels of the tree.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

from llamad.logs import configure as configure_logs
from llamad.supervisor.child import notifies_ready, notify_ready
from llamad.supervisor.runtime import Supervisor
from llamad.supervisor.spec import SupervisorSpec

__all__ = ["run_root", "run_supervisor_process"]


@notifies_ready
def run_supervisor_process(spec: Mapping[str, Any], service: str | None = None) -> NoReturn:
    """Run the supervisor described by ``spec`` (its wire form) until it stops.

    With ``service``, its dynamic API is also served as actor ``service``
    (:mod:`llamad.supervisor.service`), up before the supervisor reports ready.
    Exits 0 after SIGTERM/SIGINT or auto_shutdown, non-zero after an
    escalation or a failed initial start (so the parent sees an abnormal exit).
    """
    configure_logs()
    supervisor = Supervisor(SupervisorSpec.from_wire(spec))
    stop_service: Callable[[], None] | None = None

    def on_ready() -> None:
        nonlocal stop_service
        if service is not None:
            # Imported here: only supervisors that serve pay for ZeroMQ.
            from llamad.supervisor.service import SupervisorService  # noqa: PLC0415

            served = SupervisorService(supervisor, service)
            served.start()
            stop_service = served.stop
        notify_ready()

    try:
        code = supervisor.run(install_signal_handlers=True, on_ready=on_ready)
    finally:
        if stop_service is not None:
            stop_service()
    sys.exit(code)


def run_root(
    spec: SupervisorSpec, *, log_level: str = "info", log_format: str = "console"
) -> NoReturn:
    """Run ``spec`` as this process's root supervisor (main thread) and exit with its code.

    Configures logging first (``LLAMAD_LOG_LEVEL`` / ``LLAMAD_LOG_FORMAT``
    override the arguments, as in every llamad process), so the root's own
    events follow the log format its children use. The code is non-zero after
    an escalation or a failed start, so a service manager (systemd
    ``Restart=on-failure``) can act on it.
    """
    configure_logs(log_level, log_format)
    sys.exit(Supervisor(spec).run(install_signal_handlers=True))
