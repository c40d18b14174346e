"""Every system call and socket family the daemon uses is one the shipped unit allows.

``SystemCallFilter=`` kills a process with SIGSYS on the first call outside
its list, and ``RestrictAddressFamilies=`` refuses other sockets: a unit
that is one call too strict crashes in production on a path no unit-file
check exercises. So the real daemon runs under ``strace -f`` (every process
of its tree) through a whole life: start, two models (one saving to the ram
tier, one to disk), cold requests, exact hits, a chat through the template,
SIGTERM with its shutdown saves; then every call name and socket family
seen is checked against what the unit's own ``SystemCallFilter=`` lines
expand to (``systemd-analyze syscall-filter``) and its
``RestrictAddressFamilies=``.
"""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from daemon_harness import Daemon, prompt_text, wait_gone, wait_until
from llamad import Client
from tools import tool

pytestmark = [pytest.mark.model, pytest.mark.timeout(300)]

SHIPPED = Path(__file__).resolve().parents[3] / "packaging" / "systemd" / "llamad.service"
_CALL = re.compile(r"^\d+\s+(?:<\.\.\. )?([a-z_0-9]+)[ (]")
_SOCKET = re.compile(r"^\d+\s+socket\((AF_[A-Z0-9]+)")


def _directive(name: str) -> list[str]:
    return [
        line.partition("=")[2]
        for line in SHIPPED.read_text().splitlines()
        if line.startswith(name + "=")
    ]


def _expand(name: str, seen: set[str] | None = None) -> set[str]:
    """A syscall or ``@group`` as the calls it stands for (nested groups too)."""
    if not name.startswith("@"):
        return {name}
    seen = set() if seen is None else seen
    if name in seen:
        return set()
    seen.add(name)
    out = subprocess.run(
        [tool("systemd-analyze"), "syscall-filter", name],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    calls: set[str] = set()
    for line in out.splitlines()[1:]:
        entry = line.strip()
        if entry and not entry.startswith("#"):
            calls |= _expand(entry, seen)
    return calls


def allowed_calls() -> set[str]:
    """The unit's ``SystemCallFilter=`` lines, in order, as systemd combines them."""
    allowed: set[str] = set()
    for value in _directive("SystemCallFilter"):
        deny = value.startswith("~")
        names = set().union(*(_expand(n) for n in value.lstrip("~").split()))
        allowed = allowed - names if deny else allowed | names
    return allowed


def _is_ours(p: psutil.Process, d: Daemon) -> bool:
    """A daemon root started on this test's config (its path is unique). Not
    strace itself, nor a copy of it that has not exec'd yet: their command
    lines hold the daemon's as arguments."""
    try:
        cmd = p.cmdline()
    except psutil.Error:
        return False
    return cmd[1:] == d.launcher.command()[1:]


def _traced_root(strace: subprocess.Popen[bytes], d: Daemon) -> psutil.Process | None:
    """strace's child once it runs the daemon. strace forks short-lived
    children of its own first (probes of what ptrace supports): the first
    child seen may be one of those, gone a moment later."""
    code = strace.poll()
    if code is not None:
        raise AssertionError(
            f"strace exited {code} before the daemon started:\n{d.launcher.log_tail()}"
        )
    with contextlib.suppress(psutil.NoSuchProcess):
        for child in psutil.Process(strace.pid).children():
            if _is_ours(child, d):
                return child
    return None


def _ours(d: Daemon) -> list[psutil.Process]:
    """Daemon roots started on this test's config, wherever they run."""
    return [p for p in psutil.process_iter() if _is_ours(p, d)]


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    out = tmp_path_factory.mktemp("strace") / "daemon.trace"
    d = Daemon({"r": {}, "d": {"cache": {"save_tier": "disk"}}})
    # The launcher's command and environment, under strace: the root is
    # strace's child, so this test finds it and stops it itself.
    with d.launcher.log_path.open("ab") as log:
        strace = subprocess.Popen(
            [
                *(tool("strace"), "-f", "-qq", "-e", "signal=none", "-o", str(out)),
                *d.launcher.command(),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=d.launcher.environment(),
        )
    try:
        root = wait_until(lambda: _traced_root(strace, d), "the traced daemon")
        with Client(d.endpoint, timeout=180, connect_timeout=120) as client:
            for model in ("r", "d"):
                prompt = prompt_text(3, words=60)
                cold = client.complete(model, prompt, max_tokens=4, temperature=0.0)
                # The finish save lands in the background: wait for the hit.
                wait_until(
                    lambda m=model, p=prompt: (
                        client.complete(m, p, max_tokens=4, temperature=0.0).cache_hit_kind.value
                        == "exact"
                    ),
                    f"an exact hit on {model}",
                    timeout=120,
                )
                assert cold.generated
            chat = [{"role": "user", "content": "Say hello."}]
            assert client.complete("r", messages=chat, max_tokens=4, temperature=0.0).generated
        tree = [root, *root.children(recursive=True)]
        root.send_signal(signal.SIGTERM)
        assert strace.wait(120) == 0  # strace exits with the traced root's status
        assert not wait_gone(tree, timeout=10)
        yield out.read_text(errors="replace")
    finally:
        # A killed strace leaves the daemon running, detached: stop it first.
        for p in _ours(d):
            with contextlib.suppress(psutil.Error):
                tree = [p, *p.children(recursive=True)]
                p.send_signal(signal.SIGTERM)
                psutil.wait_procs(tree, timeout=60)
        if strace.poll() is None:
            strace.kill()
            strace.wait(10)
        d.cleanup()


def test_every_system_call_of_the_daemon_is_in_the_units_filter(trace: str) -> None:
    used = {m.group(1) for line in trace.splitlines() if (m := _CALL.match(line))}
    assert {"execve", "clone3", "mmap", "pidfd_open", "openat"} <= used  # the trace is real
    assert used - allowed_calls() == set()


def test_every_socket_of_the_daemon_is_of_an_allowed_family(trace: str) -> None:
    families = {m.group(1) for line in trace.splitlines() if (m := _SOCKET.match(line))}
    assert "AF_UNIX" in families
    (allowed,) = _directive("RestrictAddressFamilies")
    assert families - set(allowed.split()) == set()
