"""Where llamad keeps things that live outside the repository.

The native cache (llama.cpp builds, the default model) is keyed by the pins in
:mod:`llamad._pins` so that CI and later runs reuse it. ``LLAMAD_CACHE_DIR``
moves it; ``LLAMAD_DEFAULT_MODEL`` points at another GGUF.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from llamad import _pins
from llamad.errors import ConfigError, LlamadError, PathNotAllowed


class AssetMissing(LlamadError):
    """A native asset that ``make setup`` provides is not there."""

    code = "asset_missing"


def cache_root() -> Path:
    env = os.environ.get("LLAMAD_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "llamad"


def backend() -> str:
    name = os.environ.get("LLAMA_BACKEND", "cpu").strip().lower() or "cpu"
    if name not in _pins.BACKENDS:
        raise LlamadError(f"LLAMA_BACKEND={name!r} is not one of {', '.join(_pins.BACKENDS)}")
    return name


def llama_prefix(backend_name: str | None = None) -> Path:
    """Install prefix of the pinned llama.cpp build for one backend."""
    name = backend_name or backend()
    # The patches are part of the pin: a patched tree never shares a folder
    # with the plain one or with another patch set.
    patched = f"-p{_pins.LLAMA_CPP_PATCHES_SHA256[:8]}"
    return (
        cache_root()
        / "llama.cpp"
        / f"{_pins.LLAMA_CPP_PYTHON_VERSION}-{_pins.LLAMA_CPP_COMMIT}{patched}-{name}"
    )


def default_model_path() -> Path:
    """Path of the default GGUF; raises :class:`AssetMissing` if absent."""
    env = os.environ.get("LLAMAD_DEFAULT_MODEL")
    path = (
        Path(env).expanduser()
        if env
        else cache_root()
        / "models"
        / f"{_pins.DEFAULT_MODEL_WHEEL}-{_pins.DEFAULT_MODEL_WHEEL_VERSION}"
        / _pins.DEFAULT_MODEL_FILE
    )
    if not path.is_file():
        raise AssetMissing(f"default model not found at {path}; run `make setup`")
    return path


def contained_model_path(
    path: str | os.PathLike[str], model_dirs: Sequence[str | os.PathLike[str]], field: str = "path"
) -> Path:
    """The real path of ``path`` (every symlink and ``..`` resolved, as the
    kernel would) if it lies in one of ``model_dirs``; nothing says whether
    it exists. :class:`~llamad.errors.ConfigError` if it is not absolute,
    :class:`~llamad.errors.PathNotAllowed` if it lies outside (``details``:
    ``field``, ``problem``)."""
    text = os.fspath(path)
    if not os.path.isabs(text) or "\0" in text:
        problem = f"{text!r} is not an absolute path"
        raise ConfigError(f"{field}: {problem}", details={"field": field, "problem": problem})
    real = Path(os.path.realpath(text))
    allowed = [Path(os.path.realpath(d)) for d in model_dirs]
    if not any(real.is_relative_to(d) for d in allowed):
        dirs = ", ".join(str(d) for d in model_dirs) or "none configured"
        shown = text if real == Path(text) else f"{text} (which resolves to {real})"
        problem = f"{shown} is outside the allowed model directories ({dirs})"
        raise PathNotAllowed(f"{field}: {problem}", details={"field": field, "problem": problem})
    return real


HTTP_ADDRESS_FILE = "http.json"
"""Where the HTTP gateway publishes the address it bound, in the runtime
directory: ``{"url", "host", "port", "pid"}`` (the port is the real one when
``[http] port = 0``); removed when the gateway stops."""


KV_EVENTS_FILE = "kv_events.json"
"""Where cache-meta publishes its KV event endpoints, in the runtime directory:
``{"endpoint", "replay_endpoint", "topic", "block_size", "pid"}``; removed when
it stops (``docs/internals/kv-events.md``)."""


def kv_events_address(runtime_dir: str | os.PathLike[str]) -> dict[str, object] | None:
    """What the daemon's KV event publisher published (``None``: it is not publishing)."""
    import json  # noqa: PLC0415 (only the callers that look for it pay)

    try:
        found = json.loads(Path(runtime_dir, KV_EVENTS_FILE).read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def http_address(runtime_dir: str | os.PathLike[str]) -> dict[str, object] | None:
    """What the daemon's HTTP gateway published (``None``: it is not serving)."""
    import json  # noqa: PLC0415 (only the callers that look for it pay)

    try:
        found = json.loads(Path(runtime_dir, HTTP_ADDRESS_FILE).read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None
