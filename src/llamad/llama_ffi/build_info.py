"""What the compiled extension was built for, and where a model's layers run.

``build_ffi.py`` writes ``<extension>.build.json`` beside the extension: the
``LLAMA_BACKEND`` of the llama.cpp build it links against, that build's library
folder and the sha256 of every input. :func:`compute_backend` combines it with
what ggml sees at run time.

Numerics depend on the answer. On the CPU backend a token's computation gives
the same bits whatever else shares its batch or KV cache, so batched and
one-at-a-time results are identical. On a GPU the kernels are chosen by batch
shape and KV layout, so only the same computation path reproduces bits: the
same batch shapes over the same cache layout. Across shapes, results agree to
within floating-point noise.

:func:`build_identity` is this process's build as a cache identity (SPEC
C12; what it is made of: :mod:`llamad.llama_ffi.build_identity`): read once,
from the record and from the loaded libraries themselves, and logged as
``llama.build_identity`` with its hex digest and components. ``python -m
llamad.llama_ffi.build_info`` prints the same.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import structlog

from llamad.llama_ffi.build_identity import (
    NUMERIC_SWITCHES,
    BuildIdentity,
    BuildRecordError,
    LoadedBuild,
    describe_build,
)
from llamad.llama_ffi.errors import LlamaError
from llamad.llama_ffi.native import ensure_backend, ffi, lib

__all__ = ["build_identity", "build_record", "compute_backend", "loaded_build", "numeric_switches"]

log = structlog.get_logger("llamad.llama_ffi")

STAMP_SUFFIX = ".build.json"

_DEVICE_TYPES: Final = {
    int(lib.GGML_BACKEND_DEVICE_TYPE_CPU): "cpu",
    int(lib.GGML_BACKEND_DEVICE_TYPE_GPU): "gpu",
    int(lib.GGML_BACKEND_DEVICE_TYPE_IGPU): "igpu",
    int(lib.GGML_BACKEND_DEVICE_TYPE_ACCEL): "accel",
}
_MAX_FEATURES: Final = 256


def build_record() -> dict[str, Any]:
    """The record ``build_ffi.py`` wrote for the loaded extension."""
    ext = Path(sys.modules["llamad.llama_ffi._llama"].__file__ or "")
    stamp = ext.with_name(ext.name + STAMP_SUFFIX)
    try:
        record = json.loads(stamp.read_text())
    except (OSError, ValueError) as exc:
        raise LlamaError(f"{stamp}: no build record ({exc}); rebuild with build_ffi.py") from exc
    if not isinstance(record, dict) or not isinstance(record.get("backend"), str):
        raise LlamaError(f"{stamp}: malformed build record; rebuild with build_ffi.py")
    return record


def compute_backend() -> str:
    """Where offloaded layers run in this process: ``"cpu"`` when the build has
    no GPU backend or no GPU is visible, else the backend the extension was
    built for (``"cuda"``, ``"metal"``, ``"vulkan"``)."""
    ensure_backend()
    if not lib.llama_supports_gpu_offload():
        return "cpu"
    return str(build_record()["backend"])


def _text(ptr: Any) -> str:
    return "" if ptr == ffi.NULL else str(ffi.string(ptr).decode("utf-8", "replace"))


def loaded_build() -> LoadedBuild:
    """What the libllama and libggml loaded in this process report about themselves."""
    ensure_backend()
    backends: list[str] = []
    features: list[tuple[str, tuple[tuple[str, str], ...]]] = []
    names = ffi.new("const char *[]", _MAX_FEATURES)
    values = ffi.new("const char *[]", _MAX_FEATURES)
    for i in range(int(lib.ggml_backend_reg_count())):
        reg = lib.ggml_backend_reg_get(i)
        name = _text(lib.ggml_backend_reg_name(reg))
        backends.append(name)
        n = int(lib.llamad_backend_features(reg, names, values, _MAX_FEATURES))
        if n > _MAX_FEATURES:
            raise LlamaError(f"backend {name} reports {n} build features; llamad reads at most 256")
        if n >= 0:
            features.append((name, tuple((_text(names[j]), _text(values[j])) for j in range(n))))
    devices = []
    for i in range(int(lib.ggml_backend_dev_count())):
        dev = lib.ggml_backend_dev_get(i)
        kind = int(lib.ggml_backend_dev_type(dev))
        reg = _text(lib.ggml_backend_reg_name(lib.ggml_backend_dev_backend_reg(dev)))
        devices.append((reg, _DEVICE_TYPES.get(kind, f"type{kind}")))
    return LoadedBuild(
        ggml_version=_text(lib.ggml_version()),
        ggml_commit=_text(lib.ggml_commit()),
        backends=tuple(backends),
        devices=tuple(devices),
        features=tuple(features),
        switches=numeric_switches(os.environ),
    )


def _c_atoi(text: str) -> int:
    """What C's ``atoi`` makes of ``text`` (the libraries parse the switches with it)."""
    found = re.match(r"\s*([+-]?\d+)", text)
    return int(found.group(1)) if found else 0


def numeric_switches(environ: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The :data:`~llamad.llama_ffi.build_identity.NUMERIC_SWITCHES` that
    ``environ`` sets away from their default, as the libraries read them."""
    out = []
    # Each defaults to on and is read as `env == NULL || atoi(env) != 0`.
    for name in NUMERIC_SWITCHES:
        value = environ.get(name)
        if value is not None and _c_atoi(value) == 0:
            out.append((name, "0"))
    return tuple(out)


_identity_lock = threading.Lock()
_identity: BuildIdentity | None = None


def build_identity() -> BuildIdentity:
    """The identity of the libllama build loaded in this process (SPEC C12).

    Computed on the first call (a few calls into ggml and a read of the build
    record), then the same object for the life of the process: the build
    cannot change under a running process. Logged once as
    ``llama.build_identity`` (``build``: the hex digest; ``components``: what
    went into it). Raises :class:`~llamad.llama_ffi.errors.LlamaError` when
    the extension's build record predates the identity (rebuild with
    ``build_ffi.py``, which ``make setup`` runs).
    """
    global _identity
    found = _identity
    if found is not None:
        return found
    with _identity_lock:
        if _identity is None:
            try:
                identity = BuildIdentity.of(describe_build(build_record(), loaded_build()))
            except BuildRecordError as exc:
                raise LlamaError(str(exc)) from exc
            log.info("llama.build_identity", build=identity.hex, components=identity.as_dict())
            _identity = identity
        return _identity


def main() -> None:
    """Print this build's identity: the digest, then one component per line."""
    identity = build_identity()
    print(identity.hex)
    for name, value in identity.components:
        print(f"  {name}: {value}")


if __name__ == "__main__":
    main()
