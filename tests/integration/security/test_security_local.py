"""SPEC D5 on a real daemon over its default kind of endpoint (ipc in a private runtime dir).

One daemon for the module (the default model, one thread). Its private test
directory is opened to traversal (0711) so that only what the daemon itself
makes (the 0700 runtime dir, 0600 sockets) stands between another user and
its sockets. The other user is uid/gid 65534, reached by ``setresuid`` in a
child process (the tests run as root here; elsewhere they are skipped).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from daemon_harness import GREEDY, Daemon, prompt_text, wait_until
from llamad import Client, paths
from llamad.actors import Client as ActorClient
from llamad.actors import Registry
from llamad.cli import main as cli
from llamad.config import resolve_model_path
from llamad.errors import BadRequest, LlamadError, TemplateSecurityError
from llamad.front.wire import ModelState, PathNotAllowed

pytestmark = [pytest.mark.model, pytest.mark.timeout(240)]

NOBODY = 65534
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="switching to another uid needs root")

# The actors of the daemon's tree and the limit each one's socket applies
# (ZeroMQ MAXMSGSIZE, docs/internals/security.md): the worker and the
# supervisors keep the actors' default 64 MiB, cache-meta 128 MiB (a request's
# tokens frame can be a whole prompt).
ACTOR_LIMITS = {
    "model.smol": 64 << 20,
    "cache-meta": 128 << 20,
    "llamad.root": 64 << 20,
    "llamad.cache_sup": 64 << 20,
    "llamad.model_sup": 64 << 20,
}
# An op each actor answers without side effects (proof it still serves).
ACTOR_PING = {
    "model.smol": ("status", {}),
    "cache-meta": ("counters", {}),
    "llamad.root": ("count_children", None),
    "llamad.cache_sup": ("count_children", None),
    "llamad.model_sup": ("count_children", None),
}


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    d = Daemon({"smol": {}})
    # mkdtemp made the base 0700: open it to traversal only, so the daemon's
    # own modes are what keep another user out (a copy of the default setup,
    # where the runtime dir's parent is /run/user/UID or /tmp).
    d.base.chmod(0o711)
    try:
        d.start(wait_for=["smol"])
        yield d
        assert d.stop() == 0
    finally:
        d.cleanup()


def _as_nobody(target: Callable[[], Any], timeout: float = 60.0) -> Any:
    """``target()`` run in a forked child as uid/gid 65534 (the interpreter
    lies under /root here, which that user may not enter, so the child runs
    on in this process image instead of exec'ing one); its JSON result. A
    child still running after ``timeout`` is killed and the test fails: a hang."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(read)
        try:
            os.setgroups([])
            os.setresgid(NOBODY, NOBODY, NOBODY)
            os.setresuid(NOBODY, NOBODY, NOBODY)
            for key in [k for k in os.environ if k.startswith("LLAMAD_")]:
                del os.environ[key]
            os.environ["HOME"] = "/nonexistent"
            result = json.dumps(target())
        except BaseException as exc:
            result = json.dumps({"raised": f"{type(exc).__name__}: {exc}"})
        os.write(write, result.encode())
        os._exit(0)
    os.close(write)
    deadline = time.monotonic() + timeout
    while os.waitpid(pid, os.WNOHANG) == (0, 0):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(read)
            raise AssertionError(f"the other user's client still waited after {timeout} s")
        time.sleep(0.05)
    chunks = []
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
    os.close(read)
    return json.loads(b"".join(chunks))


def _reach(endpoints: list[str]) -> list[dict[str, Any]]:
    """Call every endpoint (in the other user's child); what each call did."""
    out = []
    for endpoint in endpoints:
        # Every call waits 120 s for a connection: only a refusal the client
        # recognises returns before the child's deadline.
        try:
            if endpoint == endpoints[0]:
                # The daemon's endpoint, through the public client.
                Client(endpoint, timeout=120, connect_timeout=120).list_models()
            else:
                ActorClient(endpoint, timeout=120, connect_timeout=120).call("status", {})
            got: dict[str, Any] = {"error": None}
        except Exception as exc:
            got = {
                "error": type(exc).__name__,
                "code": getattr(exc, "code", None),
                "text": str(exc),
            }
        got["endpoint"] = endpoint
        out.append(got)
    return out


def _cli(argv: list[str]) -> dict[str, Any]:
    """``llamad ARGV`` in this process (the other user's child): status and output."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = cli.main(argv)
    return {"status": status, "stdout": out.getvalue(), "stderr": err.getvalue()}


def _files(root: Path) -> dict[Path, int]:
    """Every entry under ``root`` (itself included) and its mode, links not followed."""
    found = {root: root.lstat().st_mode}
    for folder, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            p = Path(folder) / name
            with contextlib.suppress(FileNotFoundError):  # a temporary file, replaced
                found[p] = p.lstat().st_mode
    return found


# -- 1. the runtime dir and its sockets ------------------------------------------------------


def test_nothing_the_daemon_writes_is_open_to_group_or_others(
    daemon: Daemon,
) -> None:
    # A completion first, so the worker's status board, the cache's files and
    # a saved row exist too.
    reply = daemon.worker("smol").complete(prompt_text(1), max_tokens=2, **GREEDY)
    daemon.wait_saved(reply.finish_key)
    found = {**_files(daemon.runtime), **_files(daemon.state)}
    # The ram tier's rows live in /dev/shm, named after the cache instance.
    found |= {
        p: p.lstat().st_mode for p in Path("/dev/shm").glob(f"llamad-ram.{daemon.instance}.*")
    }
    actors = daemon.registry_root
    expected = [daemon.runtime / "llamad.sock", actors / "model.smol.load"]
    for name in ACTOR_LIMITS:
        expected += [actors / f"{name}.sock", actors / f"{name}.json"]
    assert not [p for p in expected if p not in found], "the daemon did not make these"
    assert stat.S_ISDIR(found[daemon.runtime])
    assert stat.S_ISSOCK(found[daemon.runtime / "llamad.sock"])
    assert [p for p in found if p.suffix == ".kvc"], "no saved ram row to check"
    open_to_others = {str(p): oct(m & 0o777) for p, m in found.items() if m & 0o077}
    assert open_to_others == {}


# -- 2. another user ----------------------------------------------------------------------


@ROOT_ONLY
def test_another_user_is_refused_at_once_and_the_owner_is_still_served(daemon: Daemon) -> None:
    reg = Registry(daemon.registry_root)
    endpoints = [daemon.endpoint]
    for name in ("model.smol", "cache-meta", "llamad.model_sup"):
        entry = reg.lookup(name)
        assert entry is not None
        endpoints.append(entry.endpoint)
    results = _as_nobody(lambda: _reach(endpoints))
    assert isinstance(results, list), results
    assert [r["endpoint"] for r in results] == endpoints
    for r in results:
        assert (r["error"], r["code"]) == ("PermissionDenied", "permission_denied"), r
        assert "permission denied" in r["text"], r
    # The owner is served as before.
    reply = daemon.worker("smol").complete(prompt_text(2), max_tokens=2, **GREEDY)
    assert reply.stats.completion_tokens == 2
    assert daemon.route("smol").actor == "model.smol"


@ROOT_ONLY
def test_the_cli_of_another_user_exits_69_naming_the_refusal(daemon: Daemon) -> None:
    run = _as_nobody(
        lambda: _cli(["--endpoint", daemon.endpoint, "--connect-timeout", "120", "models"])
    )
    assert run.get("status") == 69, run
    assert run["stderr"].startswith("llamad: permission_denied: "), run
    assert f"uid {NOBODY}" in run["stderr"]
    assert run["stdout"] == ""
    assert daemon.route("smol").actor == "model.smol"


# -- 4. model paths --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def elsewhere(daemon: Daemon) -> Path:
    """A directory outside every allowed one, with a file in it."""
    out = daemon.base / "elsewhere"
    out.mkdir(exist_ok=True)
    (out / "secret.gguf").write_bytes(b"GGUF" + b"\0" * 64)
    return out


def _refused_path(daemon: Daemon, model_id: str, path: str) -> str:
    with pytest.raises(PathNotAllowed) as info:
        daemon.load(model_id, path=path)
    assert info.value.details["field"] == f"models.{model_id}.path"
    problem: str = info.value.details["problem"]
    assert "outside the allowed model directories" in problem
    return problem


def test_a_symlink_in_an_allowed_dir_pointing_outside_is_refused(
    daemon: Daemon, elsewhere: Path
) -> None:
    link = daemon.models_dir / "innocent.gguf"
    link.symlink_to(elsewhere / "secret.gguf")
    problem = _refused_path(daemon, "linked", str(link))
    assert f"resolves to {elsewhere / 'secret.gguf'}" in problem
    # A linked directory is resolved the same way.
    (daemon.models_dir / "sub").symlink_to(elsewhere, target_is_directory=True)
    _refused_path(daemon, "linked", str(daemon.models_dir / "sub" / "secret.gguf"))
    assert daemon.route("smol").actor == "model.smol"


def test_a_dotdot_escape_from_an_allowed_dir_is_refused(daemon: Daemon, elsewhere: Path) -> None:
    escape = f"{daemon.models_dir}/../elsewhere/secret.gguf"
    _refused_path(daemon, "dotdot", escape)
    # Refused for containment before anything says whether the file exists.
    _refused_path(daemon, "dotdot", f"{daemon.models_dir}/../elsewhere/no-such.gguf")


def test_a_symlink_outside_pointing_into_an_allowed_dir_loads_its_target(
    daemon: Daemon, elsewhere: Path
) -> None:
    # The resolved target decides: a link anywhere that ends inside an allowed
    # directory reads only what the operator allowed.
    target = daemon.models_dir / "model.gguf"
    try:
        os.link(paths.default_model_path(), target)  # free where it is the same filesystem
    except OSError:
        shutil.copyfile(paths.default_model_path(), target)
    alias = elsewhere / "alias.gguf"
    alias.symlink_to(target)
    # At config load (the same function every load_model calls):
    assert resolve_model_path(alias, [daemon.models_dir]) == target
    _, info = daemon.load("aliased", path=str(alias))
    try:
        assert info.state is ModelState.READY
        assert info.path == str(target)
    finally:
        daemon.front.call("unload", {"model_id": "aliased"})


def test_an_adapter_path_outside_the_allowed_dirs_is_refused_by_the_worker(
    daemon: Daemon, elsewhere: Path
) -> None:
    # load_adapter goes straight to the worker: it checks like the front does.
    link = daemon.models_dir / "adapter-link.gguf"
    link.symlink_to(elsewhere / "secret.gguf")
    junk = daemon.models_dir / "junk-adapter.gguf"
    junk.write_bytes(b"not an adapter" * 64)
    with Client(daemon.endpoint, timeout=60) as client:
        for path in (
            elsewhere / "secret.gguf",
            link,
            Path(f"{daemon.models_dir}/../elsewhere/secret.gguf"),
            elsewhere / "no-such.gguf",
        ):
            with pytest.raises(PathNotAllowed) as refused:
                client.load_adapter("smol", str(path), name="x")
            assert refused.value.details["field"] == "path"
            assert "outside the allowed model directories" in refused.value.message
        # Inside, the worker does open it (and finds no adapter there).
        with pytest.raises(LlamadError) as opened:
            client.load_adapter("smol", str(junk), name="x")
        assert not isinstance(opened.value, PathNotAllowed), opened.value
        assert client.list_adapters("smol") == []
        reply = client.complete("smol", prompt_text(4), max_tokens=2, **GREEDY)
        assert reply.stats.completion_tokens == 2


# -- 5. message size limits on every socket ----------------------------------------------


@pytest.mark.parametrize("name", list(ACTOR_LIMITS))
def test_every_actor_drops_a_frame_over_its_limit_and_keeps_serving(
    daemon: Daemon, name: str
) -> None:
    reg = Registry(daemon.registry_root)
    entry = reg.lookup(name)
    assert entry is not None
    op, body = ACTOR_PING[name]
    with ActorClient(name=name, registry=reg, timeout=60, connect_timeout=10) as client:
        client.call(op, body)
        welcome = client.server
        assert welcome is not None
        assert welcome.max_frame_bytes == ACTOR_LIMITS[name]
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(entry.endpoint)
        # Read, a frame this big would be answered too_large (its header is
        # over any header limit); over MAXMSGSIZE ZeroMQ drops the connection
        # before allocating it, and nothing answers.
        sock.send(b"\x95" + b"x" * ACTOR_LIMITS[name])
        assert sock.poll(2000) == 0
    finally:
        sock.close()
        ctx.term()
    with ActorClient(name=name, registry=reg, timeout=60, connect_timeout=10) as client:
        client.call(op, body)
    after = reg.lookup(name)
    assert after is not None and after.pid == entry.pid, "the actor was restarted"


# -- 6. the chat template sandbox ---------------------------------------------------------

HOSTILE = "{{ messages.__class__.__mro__[1].__subclasses__() }}{{ cycler.__init__.__globals__.os }}"


def test_a_gguf_template_reaching_for_python_internals_is_refused_by_the_sandbox(
    daemon: Daemon,
) -> None:
    source = str(paths.default_model_path())
    evil = daemon.models_dir / "evil.gguf"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "gguf.scripts.gguf_new_metadata",
            "--force",
            "--chat-template",
            HOSTILE,
            source,
            str(evil),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    _, info = daemon.load("evil", path=str(evil))
    try:
        assert info.state is ModelState.READY
        worker = daemon.worker("evil")
        chat = [{"role": "user", "content": "hello"}]
        with pytest.raises(TemplateSecurityError) as refused:
            worker.apply_chat_template(chat)
        assert refused.value.code == "template_security"
        # A request cannot bring a template of its own: the chat options are closed.
        with pytest.raises(BadRequest):
            worker.actor.call(
                "apply_chat_template",
                {"messages": chat, "chat": {"chat_template": "{{ 7 * 7 }}"}},
            )
        # The worker that refused still serves.
        reply = worker.complete(prompt_text(3), max_tokens=2, **GREEDY)
        assert reply.stats.completion_tokens == 2
        assert daemon.info("evil").restarts == 0
    finally:
        daemon.front.call("unload", {"model_id": "evil"})
    wait_until(lambda: daemon.route("smol").actor == "model.smol", "smol still routed")
