"""The compiled extension, process-wide llama.cpp initialisation and log routing.

llama.cpp writes a great deal to stderr by default. :func:`ensure_backend`
(called before any model is loaded) installs a log callback that forwards
messages at or above a threshold into structlog as ``llama.log`` events and
drops the rest in C, so debug chatter never costs a trip into Python. The
threshold comes from ``LLAMAD_LLAMA_LOG`` (``debug``, ``info``, ``warn``,
``error``, ``off``; default ``warn``), or from :func:`set_log_level`, which
holds whether it is called before the backend starts or after.

:func:`llama_errors` also hands the error-level messages that llama.cpp logs
on the calling thread during a call to that caller, so an error it only
logs (a grammar it cannot parse says *why* only in its log) can be told to
whoever sent the input.
"""

from __future__ import annotations

import atexit
import functools
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import structlog

from llamad.llama_ffi.errors import LlamaError
from llamad.llama_ffi.spin import bound_openmp_spin

# libgomp reads its barrier spin once, when it loads with the extension below
# (SPEC M14: llamad.llama_ffi.spin).
bound_openmp_spin()

try:
    from llamad.llama_ffi._llama import ffi, lib
except ImportError as exc:  # pragma: no cover - only without `make setup`
    raise LlamaError("the llama.cpp binding is not built; run `make setup` (build_ffi.py)") from exc

__all__ = [
    "ensure_backend",
    "ensure_logs",
    "ffi",
    "lib",
    "llama_errors",
    "read_metadata",
    "read_string",
    "set_log_level",
    "system_info",
]

log = structlog.get_logger("llamad.llama_ffi")

LOG_LEVELS: dict[str, int] = {
    "debug": int(lib.GGML_LOG_LEVEL_DEBUG),
    "info": int(lib.GGML_LOG_LEVEL_INFO),
    "warn": int(lib.GGML_LOG_LEVEL_WARN),
    "warning": int(lib.GGML_LOG_LEVEL_WARN),
    "error": int(lib.GGML_LOG_LEVEL_ERROR),
    "off": int(lib.GGML_LOG_LEVEL_CONT),
    "none": int(lib.GGML_LOG_LEVEL_CONT),
}
_STRUCTLOG_METHOD = {
    int(lib.GGML_LOG_LEVEL_DEBUG): "debug",
    int(lib.GGML_LOG_LEVEL_INFO): "info",
    int(lib.GGML_LOG_LEVEL_WARN): "warning",
    int(lib.GGML_LOG_LEVEL_ERROR): "error",
}

_init_lock = threading.Lock()
_initialised = False
_logs_routed = False
_chosen_level: int | None = None
"""What :func:`set_log_level` chose (``None``: ``LLAMAD_LLAMA_LOG``'s)."""

_ERROR = int(lib.GGML_LOG_LEVEL_ERROR)
_capture = threading.local()
"""``errors``: the list :func:`llama_errors` collects into on this thread."""


@contextmanager
def llama_errors() -> Iterator[list[str]]:
    """Collect the error-level messages llama.cpp logs *on this thread* while
    the block runs (they still reach the log as well).

    Empty when llama.cpp logged none, or when its log level is ``off``
    (those messages are dropped in C before they reach Python).
    """
    found: list[str] = []
    outer = getattr(_capture, "errors", None)
    _capture.errors = found
    try:
        yield found
    finally:
        _capture.errors = outer


@ffi.def_extern(onerror=lambda *_: None)  # type: ignore[untyped-decorator]
def _llamad_log_cb(level: int, text: Any, _user_data: Any) -> None:
    # Runs on llama.cpp's threads as well as ours; it must never raise into C,
    # hence the blanket guard (and onerror as the last line of defence).
    try:
        message = ffi.string(text).decode("utf-8", "replace").strip()
        # Load progress is drawn as bare dots; they carry no information.
        if not message or not message.strip("."):
            return
        method = _STRUCTLOG_METHOD.get(int(level), "info")
        getattr(log, method)("llama.log", message=message)
        if int(level) == _ERROR:
            collecting = getattr(_capture, "errors", None)
            if collecting is not None:
                collecting.append(message)
    except BaseException:
        return


def _level_from_env() -> int:
    raw = os.environ.get("LLAMAD_LLAMA_LOG", "warn").strip().lower()
    return LOG_LEVELS.get(raw, LOG_LEVELS["warn"])


def set_log_level(level: str) -> None:
    """Change which llama.cpp messages reach structlog (``debug`` … ``off``)."""
    value = LOG_LEVELS.get(level.strip().lower()) if isinstance(level, str) else None
    if value is None:
        raise LlamaError(f"unknown llama log level {level!r}; expected one of {sorted(LOG_LEVELS)}")
    global _chosen_level
    with _init_lock:
        # Kept for ensure_backend too: a level chosen before the first model
        # load must not be replaced by the environment's when the backend starts.
        _chosen_level = value
        lib.llamad_log_install(value)


def _silence_at_exit() -> None:
    # A C++ destructor that logs after the interpreter is finalised would call
    # into a dead interpreter; past this point logging stays entirely in C.
    lib.llamad_log_install(LOG_LEVELS["off"])


def ensure_logs() -> None:
    """Route llama.cpp's and ggml's log into structlog, once per process
    (idempotent), without starting the backend (``llama_backend_init`` costs
    ~0.8 MB resident, SPEC P9: a process that only calls ggml needs no more)."""
    global _logs_routed
    if _logs_routed:
        return
    with _init_lock:
        if _logs_routed:
            return
        lib.llamad_log_install(_level_from_env() if _chosen_level is None else _chosen_level)
        atexit.register(_silence_at_exit)
        _logs_routed = True


def ensure_backend() -> None:
    """Initialise llama.cpp once per process and route its logs (idempotent)."""
    global _initialised
    if _initialised:
        return
    ensure_logs()
    with _init_lock:
        if _initialised:
            return
        lib.llama_backend_init()
        _initialised = True


def system_info() -> str:
    """llama.cpp's one-line description of the CPU features it was built for."""
    ensure_backend()
    return str(ffi.string(lib.llama_print_system_info()).decode("utf-8", "replace"))


def read_string(fn: Callable[[Any, int], int], initial: int = 256) -> str | None:
    """Call a llama.cpp ``(buf, size) -> length`` string getter, growing the
    buffer until the value fits; None when llama.cpp reports no value."""
    size = initial
    while True:
        buf = ffi.new("char[]", size)
        n = int(fn(buf, size))
        if n < 0:
            return None
        if n < size:
            return bytes(ffi.buffer(buf, n)).decode("utf-8", "replace")
        size = n + 1


def read_metadata(
    owner: Any,
    count: Callable[[Any], int],
    key_by_index: Callable[[Any, int, Any, int], int],
    val_by_index: Callable[[Any, int, Any, int], int],
) -> dict[str, str]:
    """GGUF scalar metadata of a model or adapter through llama.cpp's indexed getters."""
    out: dict[str, str] = {}
    for i in range(int(count(owner))):
        key = read_string(functools.partial(key_by_index, owner, i))
        val = read_string(functools.partial(val_by_index, owner, i))
        if key is not None and val is not None:
            out[key] = val
    return out
