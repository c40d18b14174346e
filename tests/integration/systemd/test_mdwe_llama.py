"""``MemoryDenyWriteExecute=yes``: llama.cpp, cffi and the daemon run without W+X memory.

systemd implements the directive in one of two ways, and both are applied
here exactly as systemd applies them: before ``exec`` (``preexec_fn``), so
the interpreter's own start runs under them too.

- ``prctl``: ``PR_SET_MDWE`` with ``PR_MDWE_REFUSE_EXEC_GAIN`` (newer systemd
  on kernels >= 6.3): no mapping may be writable and executable, and none may
  become executable later.
- ``seccomp``: the filter of systemd 252 (``seccomp_memory_deny_write_execute``):
  ``mmap`` with ``PROT_WRITE|PROT_EXEC``, ``mprotect``/``pkey_mprotect`` with
  ``PROT_EXEC`` at all, and ``shmat`` with ``SHM_EXEC`` fail with ``EPERM``.
  Stricter than the prctl: even re-protecting an executable mapping is refused.

Each child first proves the guard is in force (a W+X ``mmap`` and an exec
gain by ``mprotect`` both refused; allowed without a guard), then loads the
real default model through ``llamad.llama_ffi`` (a compiled cffi extension
in API mode: its callbacks are C functions compiled into it, so no libffi
closure needs W+X), decodes, samples, packs and restores a sequence. The
daemon then runs under both guards at once and answers a completion through
the public client; every process of its tree shows the seccomp filter.
"""

from __future__ import annotations

import ctypes
import json
import platform
import struct
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from daemon_harness import Daemon
from llamad import Client

pytestmark = [pytest.mark.model, pytest.mark.timeout(180)]

PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
PR_SET_MDWE = 65
PR_MDWE_REFUSE_EXEC_GAIN = 1
PROT_WRITE, PROT_EXEC, SHM_EXEC = 0x2, 0x4, 0o100000

X86_64 = platform.machine() == "x86_64"

# BPF, as linux/filter.h and linux/seccomp.h spell it.
_LD_W_ABS, _JEQ_K, _JSET_K, _AND_K, _RET_K = 0x20, 0x15, 0x45, 0x54, 0x06
_AUDIT_ARCH_X86_64 = 0xC000003E
_RET_ALLOW, _RET_EPERM = 0x7FFF0000, 0x00050000 | 1
_NR = {"mmap": 9, "mprotect": 10, "shmat": 30, "pkey_mprotect": 329}
_ARG2 = 16 + 2 * 8  # seccomp_data.args[2], its low word (flags fit in 32 bits)


def _assemble(program: list[tuple[str | None, int, int | str, int | str, int]]) -> bytes:
    """``(label, code, jt, jf, k)`` rows, jumps given as labels, into sock_filter bytes."""
    where = {label: i for i, (label, *_rest) in enumerate(program) if label}
    out = b""
    for i, (_, code, jt, jf, k) in enumerate(program):
        rel = [0 if j == 0 else where[j] - i - 1 if isinstance(j, str) else j for j in (jt, jf)]
        out += struct.pack("HBBI", code, rel[0], rel[1], k)
    return out


def systemd_mdwe_filter() -> bytes:
    """systemd 252's MemoryDenyWriteExecute filter for x86_64."""
    return _assemble(
        [
            (None, _LD_W_ABS, 0, 0, 4),  # arch
            (None, _JEQ_K, 0, "allow", _AUDIT_ARCH_X86_64),
            (None, _LD_W_ABS, 0, 0, 0),  # nr
            (None, _JEQ_K, "mmap", 0, _NR["mmap"]),
            (None, _JEQ_K, "exec", 0, _NR["mprotect"]),
            (None, _JEQ_K, "exec", 0, _NR["pkey_mprotect"]),
            (None, _JEQ_K, "shm", "allow", _NR["shmat"]),
            ("mmap", _LD_W_ABS, 0, 0, _ARG2),
            (None, _AND_K, 0, 0, PROT_WRITE | PROT_EXEC),
            (None, _JEQ_K, "deny", "allow", PROT_WRITE | PROT_EXEC),
            ("exec", _LD_W_ABS, 0, 0, _ARG2),
            (None, _JSET_K, "deny", "allow", PROT_EXEC),
            ("shm", _LD_W_ABS, 0, 0, _ARG2),
            (None, _JSET_K, "deny", "allow", SHM_EXEC),
            ("allow", _RET_K, 0, 0, _RET_ALLOW),  # BPF jumps only forward: verdicts last
            ("deny", _RET_K, 0, 0, _RET_EPERM),
        ]
    )


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def guard(modes: tuple[str, ...]) -> Callable[[], None]:
    """A ``preexec_fn`` that applies ``modes`` ("prctl", "seccomp") in the child."""
    libc = ctypes.CDLL(None, use_errno=True)
    code = ctypes.create_string_buffer(systemd_mdwe_filter())
    prog = _SockFprog(len(code.raw) // 8, ctypes.addressof(code))

    def apply() -> None:
        assert code  # the filter's bytes live as long as the hook does
        if "seccomp" in modes:
            if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS")
            if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "PR_SET_SECCOMP")
        if "prctl" in modes and libc.prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "PR_SET_MDWE")

    return apply


CHILD = textwrap.dedent(
    """
    import ctypes, json, mmap, sys
    out = {}
    try:
        mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        out["wx_mmap"] = "allowed"
    except OSError as exc:
        out["wx_mmap"] = exc.errno
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    page = libc.mmap(None, 4096, 0x1 | 0x2, 0x02 | 0x20, -1, 0)  # RW, private anonymous
    rc = libc.mprotect(page, 4096, 0x1 | 0x4)  # gain exec
    out["exec_gain"] = "allowed" if rc == 0 else ctypes.get_errno()

    from llamad import paths
    from llamad.llama_ffi import ContextOptions, Model, Sampler, SamplerParams

    opts = ContextOptions(n_ctx=512, n_batch=256, n_ubatch=256, n_threads=1, n_threads_batch=1)
    with Model(paths.default_model_path()) as model:
        tokens = model.tokenize("The sea at night is")
        with model.context(opts) as a, model.context(opts) as b:
            a.prefill(tokens[:-1])
            state = bytearray(a.seq_state_size(0))
            state = bytes(state[: a.pack_seq(0, state)])
            a.prefill(tokens[-1:])
            with Sampler(model, SamplerParams(greedy=True)) as s:
                out["generated"] = a.generate(s, 12, stop_at_eog=False)
            b.unpack_seq(0, state)
            b.prefill(tokens[-1:])
            with Sampler(model, SamplerParams(greedy=True)) as s:
                out["restored"] = b.generate(s, 12, stop_at_eog=False)
            with Sampler(model, SamplerParams(temperature=0.8, seed=7)) as s:
                out["sampled"] = b.generate(s, 4, stop_at_eog=False)
    print(json.dumps(out))
    """
)


def run_child(modes: tuple[str, ...]) -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD],
        preexec_fn=guard(modes),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, f"{modes}: exit {proc.returncode}\n{proc.stderr[-3000:]}"
    result: dict[str, object] = json.loads(proc.stdout.splitlines()[-1])
    return result


@pytest.fixture(scope="module")
def unguarded() -> dict[str, object]:
    return run_child(())


def test_without_a_guard_write_execute_memory_is_allowed(unguarded: dict[str, object]) -> None:
    # The control: the probes below tell a guarded process from one that is not.
    assert unguarded["wx_mmap"] == "allowed" and unguarded["exec_gain"] == "allowed"


@pytest.mark.parametrize(
    "mode",
    [
        "prctl",
        pytest.param(
            "seccomp", marks=pytest.mark.skipif(not X86_64, reason="the filter is x86_64's")
        ),
    ],
)
def test_llama_cpp_decodes_samples_and_restores_under_memory_deny_write_execute(
    mode: str, unguarded: dict[str, object]
) -> None:
    out = run_child((mode,))
    assert out["wx_mmap"] != "allowed" and out["exec_gain"] != "allowed", out
    assert out["generated"] == unguarded["generated"]
    assert out["restored"] == out["generated"]
    assert out["sampled"] == unguarded["sampled"]


@pytest.fixture(scope="module")
def guarded_daemon() -> Iterator[Daemon]:
    if not X86_64:
        pytest.skip("the seccomp filter is x86_64's")
    d = Daemon({"m": {}})
    try:
        # As systemd does: the guard between fork and exec. The hook makes
        # only prctl calls, safe in a child forked from a threaded process.
        d.start(preexec_fn=guard(("seccomp", "prctl")))
        yield d
    finally:
        d.cleanup()


def _seccomp_mode(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Seccomp:"):
            return line.split()[1]
    return "?"


def test_the_daemon_serves_a_completion_under_memory_deny_write_execute(
    guarded_daemon: Daemon,
) -> None:
    d = guarded_daemon
    with Client(d.endpoint, timeout=120, connect_timeout=90) as client:
        reply = client.complete("m", "The sea at night is", max_tokens=8, temperature=0.0)
    assert len(reply.generated) == 8
    tree = [psutil.Process(d.pid), *d.tree()]
    assert len(tree) >= 4  # root (and its hosted supervisors), cache-meta, worker, front
    # "2": a seccomp filter; children inherit it across fork and exec.
    assert {p.pid: _seccomp_mode(p.pid) for p in tree} == {p.pid: "2" for p in tree}
    assert d.stop() == 0
