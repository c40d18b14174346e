"""systemd's notification protocol against a real daemon and a fake systemd.

The daemon runs as a subprocess (``daemon_harness``) with ``$NOTIFY_SOCKET``
naming a real datagram socket this test binds (abstract for the shared
daemon, a path for the one that is stopped) and a short ``$WATCHDOG_USEC``.
The shared daemon serves two configured models; one of them is made slow to
load by SIGSTOPping its worker while it loads, so READY has something to
wait for.
"""

from __future__ import annotations

import itertools
import os
import signal
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from daemon_harness import GREEDY, Daemon, prompt_text, wait_until
from llamad.front.wire import ModelState
from notify_listener import Notice, NotifyListener

pytestmark = [pytest.mark.model, pytest.mark.timeout(240)]

WATCHDOG_USEC = 2_000_000
PING_S = WATCHDOG_USEC / 2_000_000  # the daemon pings every half of it
HOLD_S = 4.0  # how long the slow model's load is held up
ENDLESS = 'root ::= "la " root'


def _worker_process(d: Daemon, child_id: str, timeout: float = 90.0) -> psutil.Process:
    """The model worker ``child_id`` as soon as its process exists (before it has loaded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in d.tree():
            try:
                cmd = p.cmdline()
            except psutil.Error:
                continue
            if "--id" in cmd and cmd[cmd.index("--id") + 1] == child_id:
                return p
        time.sleep(0.005)
    raise AssertionError(f"no process {child_id} within {timeout}s")


def _env(listener: NotifyListener, watchdog_usec: int | None) -> dict[str, str]:
    env = {"NOTIFY_SOCKET": listener.env_value}
    if watchdog_usec is not None:
        env["WATCHDOG_USEC"] = str(watchdog_usec)
    return env


def _start(d: Daemon, env: dict[str, str]) -> None:
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        d.start()


@dataclass
class Served:
    d: Daemon
    notify: NotifyListener
    held_from: float
    released_at: float
    ready: Notice


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    d = Daemon({"fast": {}, "slow": {}})
    notify = NotifyListener("abstract", tmp_path_factory.mktemp("notify"))
    try:
        _start(d, _env(notify, WATCHDOG_USEC))
        slow = _worker_process(d, "model.slow")
        slow.suspend()
        held_from = time.monotonic()
        # Held while loading: the front still waits for it.
        assert d.info("slow").state is ModelState.LOADING
        wait_until(
            lambda: any("Loading" in s and "slow" in s for s in notify.statuses()),
            "a STATUS naming the slow model's load",
            30,
        )
        time.sleep(max(0.0, held_from + HOLD_S - time.monotonic()))
        assert not notify.with_key("READY"), "READY while a configured model was still loading"
        released_at = time.monotonic()
        slow.resume()
        ready = notify.wait_for(lambda n: n.has("READY"), "READY=1", 90)
        yield Served(d, notify, held_from, released_at, ready)
    finally:
        d.cleanup()
        notify.close()


def test_ready_comes_only_after_every_configured_model_has_loaded(served: Served) -> None:
    d, notify = served.d, served.notify
    assert served.ready.fields["READY"] == "1"
    assert served.ready.at > served.released_at
    for model_id in ("fast", "slow"):
        info = d.info(model_id)
        assert info.state is ModelState.READY
        assert info.loaded_at is not None and info.loaded_at <= served.ready.wall
    before = [n for n in notify.all() if n.at < served.ready.at]
    statuses = [n.fields["STATUS"] for n in before if n.has("STATUS")]
    assert any(s.startswith("Starting") for s in statuses), statuses
    assert any(s.startswith("Loading") and "slow" in s for s in statuses), statuses
    # The start timeout is pushed back while the slow model loads.
    extends = [int(n.fields["EXTEND_TIMEOUT_USEC"]) for n in before if n.has("EXTEND_TIMEOUT_USEC")]
    assert extends and min(extends) > 0
    assert "Serving 2 models" in served.ready.fields["STATUS"]


def test_only_the_root_process_reports_and_no_child_inherits_the_socket(served: Served) -> None:
    d, notify = served.d, served.notify
    assert {n.pid for n in notify.all()} == {d.pid}  # NotifyAccess=main
    for p in d.tree():
        env = p.environ()
        assert "NOTIFY_SOCKET" not in env and "WATCHDOG_USEC" not in env, p.cmdline()


def test_status_counts_the_active_requests(served: Served) -> None:
    d, notify = served.d, served.notify
    since = time.monotonic()
    stream = d.worker("fast").infer(prompt_text(3), max_tokens=100_000, grammar=ENDLESS, **GREEDY)
    events = iter(stream)
    next(events)
    try:
        notify.wait_for(
            lambda n: n.at > since and "1 active request" in n.fields.get("STATUS", ""),
            "STATUS with the request in flight",
            20,
        )
    finally:
        stream.cancel()
        list(events)
    notify.wait_for(
        lambda n: n.at > since and "0 active requests" in n.fields.get("STATUS", ""),
        "STATUS once it ended",
        20,
    )


def _pings(notify: NotifyListener, since: float) -> list[float]:
    return [n.at for n in notify.with_key("WATCHDOG", since)]


def test_watchdog_pings_every_half_of_watchdog_usec(served: Served) -> None:
    notify = served.notify
    since = time.monotonic()
    wait_until(lambda: len(_pings(notify, since)) >= 7, "7 watchdog pings", 30)
    pings = _pings(notify, since)
    gaps = [b - a for a, b in itertools.pairwise(pings)]
    assert all(n.fields["WATCHDOG"] == "1" for n in notify.with_key("WATCHDOG", since))
    assert 0.8 * PING_S <= statistics.median(gaps) <= 1.3 * PING_S, gaps
    # systemd acts after a whole WATCHDOG_USEC without a ping.
    assert max(gaps) < 2 * PING_S, gaps


def test_no_watchdog_while_a_child_is_stopped_past_its_heartbeat(served: Served) -> None:
    d, notify = served.d, served.notify
    front = psutil.Process(d.child_pid("front"))
    front.suspend()
    stopped_at = time.monotonic()
    try:
        # The front beats every 3.75 s (liveness 15 s); late at half its window,
        # the root stops pinging, well before it would kill the front at 15 s.
        def silent_for(seconds: float) -> bool:
            last = max(_pings(notify, 0.0), default=0.0)
            return time.monotonic() - last >= seconds

        wait_until(lambda: silent_for(3 * PING_S), "pings to stop", 12)
        assert time.monotonic() - stopped_at < 14, "too late to resume before the root kills it"
        assert front.status() == psutil.STATUS_STOPPED
    finally:
        resumed_at = time.monotonic()
        front.resume()
    notify.wait_for(lambda n: n.has("WATCHDOG") and n.at > resumed_at, "a ping after SIGCONT", 10)
    assert d.child_pid("front") == front.pid  # resumed, not restarted
    pings = _pings(notify, stopped_at)
    assert pings and pings[0] < stopped_at + 8  # pinged on until the front was late
    events = "\n".join(d.log_events())
    assert "daemon.watchdog_withheld" in events and '"front"' in events


def test_stopping_then_exit_0_on_sigterm_over_a_path_socket(tmp_path: Path) -> None:
    d = Daemon({"m": {}})
    notify = NotifyListener("path", tmp_path)
    try:
        _start(d, _env(notify, None))
        notify.wait_for(lambda n: n.has("READY"), "READY=1 on a path socket", 90)
        assert d.proc is not None
        d.proc.send_signal(signal.SIGTERM)
        code = d.proc.wait(60)
        exited_at = time.monotonic()
        assert code == 0
        stopping = notify.wait_for(lambda n: n.has("STOPPING"), "STOPPING=1", 5)
        assert stopping.fields["STOPPING"] == "1" and stopping.at < exited_at
        assert stopping.pid == d.pid
        assert not notify.with_key("WATCHDOG")  # no $WATCHDOG_USEC, no pings
        after = [n.fields.get("STATUS", "") for n in notify.all() if n.at >= stopping.at]
        assert any("front stopped" in s for s in after), after
        assert os.path.exists(notify.env_value)
    finally:
        d.cleanup()
        notify.close()
