"""A program that uses the client without configuring logging sees only its own output.

The client's actors layer logs through structlog (``actor.client.connected``
at debug on every connection). Unconfigured, structlog would print those on
the program's stdout; :func:`llamad.logs.library_default` routes them into
``logging`` instead, where nothing below WARNING shows, and never replaces a
configuration the program made itself.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from daemon_proc import DaemonProc
from llamad.testing import scrubbed_env

pytestmark = [pytest.mark.model, pytest.mark.timeout(180)]


def _program(daemon: DaemonProc, *parts: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "\n".join(textwrap.dedent(p) for p in parts)],
        capture_output=True,
        text=True,
        timeout=120,
        env=scrubbed_env({"ENDPOINT": daemon.endpoint, "MODEL": daemon.model_id}),
        check=False,
    )


_USES_THE_CLIENT = """
    import asyncio, os
    from llamad import AsyncClient, Client

    with Client(os.environ["ENDPOINT"]) as c:
        print("sync", len(c.tokenize(os.environ["MODEL"], "hello")))

    async def main():
        async with AsyncClient(os.environ["ENDPOINT"]) as c:
            print("async", len(await c.tokenize(os.environ["MODEL"], "hello")))

    asyncio.run(main())
"""


def test_a_program_using_the_client_prints_only_its_own_output(daemon: DaemonProc) -> None:
    run = _program(daemon, _USES_THE_CLIENT)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["sync 1", "async 1"]
    assert run.stderr == ""


def test_a_program_that_configures_logging_gets_the_client_debug_lines(
    daemon: DaemonProc,
) -> None:
    run = _program(
        daemon,
        """
        import logging, sys
        logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)
        """,
        _USES_THE_CLIENT,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["sync 1", "async 1"]
    assert "actor.client.connected" in run.stderr, run.stderr


def test_a_structlog_configuration_of_the_program_is_kept(daemon: DaemonProc) -> None:
    run = _program(
        daemon,
        """
        import structlog, sys
        structlog.configure(
            processors=[structlog.processors.KeyValueRenderer()],
            logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        )
        """,
        _USES_THE_CLIENT,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["sync 1", "async 1"]
    assert "event='actor.client.connected'" in run.stderr, run.stderr
