"""llamad._lazy.defer_module: a deferred module costs nothing until it is used."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(60)


def _run(code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return out.stdout.strip()


def test_structlog_logs_without_loading_a_deferred_asyncio() -> None:
    out = _run(
        "import sys\n"
        "from llamad._lazy import defer_module\n"
        "defer_module('asyncio')\n"
        "import structlog\n"
        "structlog.get_logger('t').info('hello', n=1)\n"
        "print('ssl' in sys.modules, 'asyncio.events' in sys.modules)\n"
    )
    assert out.splitlines()[-1] == "False False"


def test_the_first_use_of_a_deferred_module_imports_it() -> None:
    out = _run(
        "import sys\n"
        "from llamad._lazy import defer_module\n"
        "defer_module('asyncio')\n"
        "import asyncio\n"
        "async def f():\n"
        "    return 7\n"
        "print(asyncio.run(f()), type(sys.modules['asyncio']).__name__)\n"
        "from asyncio import events\n"
        "import asyncio.queues\n"
        "print(asyncio.Queue is asyncio.queues.Queue, events.get_event_loop_policy() is not None)\n"
    )
    assert out.splitlines() == ["7 module", "True True"]


def test_an_imported_module_is_left_alone() -> None:
    out = _run(
        "import sys, asyncio\n"
        "from llamad._lazy import defer_module\n"
        "defer_module('asyncio')\n"
        "print(sys.modules['asyncio'] is asyncio)\n"
    )
    assert out == "True"
