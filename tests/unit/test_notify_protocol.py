"""llamad.daemon.notify: the sd_notify datagram protocol over real sockets (no daemon)."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from llamad.daemon.notify import Notifier, notify_address, status_line, watchdog_interval

pytestmark = pytest.mark.timeout(10)


@pytest.fixture(params=["abstract", "path"])
def receiver(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.settimeout(2)
    if request.param == "abstract":
        name = f"llamad-unit-{uuid.uuid4().hex}"
        sock.bind("\0" + name)
        value = "@" + name
    else:
        value = str(tmp_path / "notify.sock")
        sock.bind(value)
    yield sock, value
    sock.close()


def test_notify_address_reads_abstract_and_path_forms() -> None:
    assert notify_address("@/org/freedesktop/systemd1/notify/1") == (
        "\0/org/freedesktop/systemd1/notify/1"
    )
    assert notify_address("/run/systemd/notify") == "/run/systemd/notify"
    for bad in ("", "@", "relative/path", "vsock:2:1234"):
        with pytest.raises(ValueError):
            notify_address(bad)


def test_watchdog_interval_is_half_of_watchdog_usec_for_this_process_only() -> None:
    assert watchdog_interval({"WATCHDOG_USEC": "30000000"}, 7) == 15.0
    assert watchdog_interval({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "7"}, 7) == 1.0
    assert watchdog_interval({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "8"}, 7) is None
    assert watchdog_interval({}, 7) is None
    assert watchdog_interval({"WATCHDOG_USEC": "0"}, 7) is None
    assert watchdog_interval({"WATCHDOG_USEC": "soon"}, 7) is None


def test_each_report_is_one_datagram_of_assignments(receiver: tuple[socket.socket, str]) -> None:
    sock, value = receiver
    env = {"NOTIFY_SOCKET": value, "WATCHDOG_USEC": "4000000"}
    n = Notifier.from_environ(env)
    try:
        assert n.enabled and n.watchdog_s == 2.0
        assert n.ready("Serving 1 model\nwith a newline")
        assert sock.recv(4096) == b"READY=1\nSTATUS=Serving 1 model with a newline"
        assert n.watchdog()
        assert sock.recv(4096) == b"WATCHDOG=1"
        assert n.extend_timeout(15)
        assert sock.recv(4096) == b"EXTEND_TIMEOUT_USEC=15000000"
        assert n.stopping("Stopping")
        assert sock.recv(4096) == b"STOPPING=1\nSTATUS=Stopping"
    finally:
        n.close()


def test_the_environment_is_taken_so_no_child_inherits_it(
    receiver: tuple[socket.socket, str],
) -> None:
    env = {"NOTIFY_SOCKET": receiver[1], "WATCHDOG_USEC": "1", "WATCHDOG_PID": "1", "HOME": "/"}
    Notifier.from_environ(env).close()
    assert env == {"HOME": "/"}


def test_without_notify_socket_nothing_is_sent_and_nothing_fails() -> None:
    n = Notifier.from_environ({"WATCHDOG_USEC": "2000000"})
    assert not n.enabled and n.watchdog_s is None
    assert not n.ready("x") and not n.watchdog() and not n.stopping("x")
    n.close()


def test_a_gone_manager_is_logged_not_raised(tmp_path: Path) -> None:
    path = tmp_path / "gone.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    n = Notifier.from_environ({"NOTIFY_SOCKET": str(path)})
    try:
        assert n.status("up")
        sock.close()
        os.unlink(path)
        assert not n.status("still up")  # ENOENT/ECONNREFUSED: reported, not raised
        assert not n.watchdog()
    finally:
        n.close()


def test_an_unusable_socket_value_disables_reporting() -> None:
    assert not Notifier.from_environ({"NOTIFY_SOCKET": "vsock:2:99"}).enabled


def test_status_line_is_one_bounded_line() -> None:
    assert status_line("a\nb\tc") == "STATUS=a b c"
    assert len(status_line("x" * 5000)) == len("STATUS=") + 1024
