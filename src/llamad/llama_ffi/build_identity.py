"""What a libllama build's identity is made of (SPEC C12), without loading one.

A KV state is only as good as the build that computed it: another llama.cpp
may save states in another format, and another backend, kernel set or
optimisation level computes other bits, so a continuation from a restored
row would differ from the same prompt computed fresh. The cache namespace
therefore carries the build (``llamad.model.identity`` folds
:attr:`BuildIdentity.digest` into every ``ctx_hash``).

:func:`describe_build` turns two sets of facts into the identity's named
components:

- the **record** ``build_ffi.py`` wrote beside the extension (``pin``: the
  llama.cpp commit and llama-cpp-python sdist it was built from;
  ``backend``: ``LLAMA_BACKEND``; ``configured``: the build folder's
  ``.configured`` stamp from ``scripts/native.py``, i.e. every CMake flag and
  configure variable; ``compilers``: the id and version of each compiler CMake
  used);
- what the **loaded** libraries report about themselves
  (:class:`LoadedBuild`: ggml's version and commit, the backend registries
  compiled in, the devices they found in this process, and each registry's
  build features: the CPU instruction sets compiled in, CUDA's architectures
  and kernel switches; the same facts ``llama_print_system_info`` prints).

Everything that can change a kernel, a floating-point result or the saved
state format is in, and anything new is in by default (an unknown CMake flag,
an unknown feature: a needless split costs a cold prefill, a wrong restore
costs a wrong answer). Out, each with its reason in :data:`NEUTRAL_CMAKE`,
:data:`NEUTRAL_ENV` and :data:`NEUTRAL_FEATURES`: what is built beside the
libraries, how the build runs, the threading runtime, and compiler *paths*
(the compilers are in by id and version). Nothing path-, host- or
time-dependent is read: the library folder, the hostname and build times
never split the namespace. Thread counts and batch sizes are not part of a
build at all (``ContextOptions``; see ``llamad.model.identity``).

This module is pure (it never loads libllama); :func:`llamad.llama_ffi.build_info.build_identity`
reads the facts of the build loaded in this process, once.
"""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "BUILD_IDENTITY_DOMAIN",
    "NEUTRAL_CMAKE",
    "NEUTRAL_ENV",
    "NEUTRAL_FEATURES",
    "NUMERIC_SWITCHES",
    "BuildIdentity",
    "LoadedBuild",
    "describe_build",
]

BUILD_IDENTITY_DOMAIN: Final = b"llamad.build_identity.v1\x00"
"""Prefix of the digest's preimage: no other digest llamad makes hashes the same bytes."""

_ALONGSIDE = "which programs are built beside the libraries; libllama and libggml are the same"
_LAUNCH = "how compilations are cached or launched; the same compiler compiles the same code"
_WARNINGS = "which diagnostics the compiler prints; the same code"
_COMPILER_PATH = "a path to a compiler; the compiler it selects is in `compilers` by id and version"

NEUTRAL_CMAKE: Final[Mapping[str, str]] = {
    "BUILD_SHARED_LIBS": "shared or static linkage; the same code runs",
    "LLAMA_BUILD_TESTS": _ALONGSIDE,
    "LLAMA_BUILD_EXAMPLES": _ALONGSIDE,
    "LLAMA_BUILD_TOOLS": _ALONGSIDE,
    "LLAMA_BUILD_SERVER": _ALONGSIDE,
    "LLAMA_BUILD_APP": _ALONGSIDE,
    "LLAMA_BUILD_UI": _ALONGSIDE,
    "LLAMA_USE_PREBUILT_UI": _ALONGSIDE,
    "LLAMA_BUILD_COMMON": _ALONGSIDE,
    "LLAMA_TOOLS_INSTALL": _ALONGSIDE,
    "LLAMA_TESTS_INSTALL": _ALONGSIDE,
    "LLAMA_OPENSSL": "HTTPS for the tools' downloads; libllama does not use it",
    "LLAMA_CURL": "downloads for the tools; libllama does not use it",
    "LLAMA_LLGUIDANCE": "a grammar engine for the tools' common library; libllama does not use it",
    "GGML_OPENMP": (
        "the threading runtime: which threads run a graph's rows, not what they compute "
        "(every row is computed whole by one thread either way)"
    ),
    "GGML_CCACHE": _LAUNCH,
    "CMAKE_C_COMPILER_LAUNCHER": _LAUNCH,
    "CMAKE_CXX_COMPILER_LAUNCHER": _LAUNCH,
    "CMAKE_CUDA_COMPILER_LAUNCHER": _LAUNCH,
    "CMAKE_INSTALL_PREFIX": "where an install would copy the files",
    "CMAKE_EXPORT_COMPILE_COMMANDS": "a compile database for editors",
    "LLAMA_ALL_WARNINGS": _WARNINGS,
    "LLAMA_FATAL_WARNINGS": _WARNINGS,
    "GGML_ALL_WARNINGS": _WARNINGS,
    "GGML_FATAL_WARNINGS": _WARNINGS,
    "CMAKE_C_COMPILER": _COMPILER_PATH,
    "CMAKE_CXX_COMPILER": _COMPILER_PATH,
    "CMAKE_CUDA_COMPILER": _COMPILER_PATH,
    "CMAKE_CUDA_HOST_COMPILER": _COMPILER_PATH,
    "LLAMA_BUILD_NUMBER": "a label for version strings; the source is identified by the pin",
    "LLAMA_BUILD_COMMIT": "a label for version strings; the source is identified by the pin",
}
"""CMake ``-D`` settings left out of the identity, each with why it cannot change
a kernel, a result or the state format. Every other setting is in:
``CMAKE_BUILD_TYPE`` (the optimisation level), ``GGML_NATIVE`` and the
instruction-set switches, the backend switches (``GGML_CUDA`` ...),
``CMAKE_CUDA_ARCHITECTURES``, kernel switches (``GGML_LLAMAFILE``,
``GGML_CUDA_FORCE_MMQ``, ``GGML_CUDA_F16`` ...), and any flag not listed here."""

NEUTRAL_ENV: Final[Mapping[str, str]] = {
    "CC": _COMPILER_PATH,
    "CXX": _COMPILER_PATH,
    "CUDACXX": _COMPILER_PATH,
    "CUDAHOSTCXX": _COMPILER_PATH,
    "CMAKE_GENERATOR": "which build tool runs the compiler (make, ninja); the same compilations",
}
"""Configure variables of the stamp left out of the identity. The others are in:
``CFLAGS``/``CXXFLAGS``/``CUDAFLAGS`` (``-O``, ``-march``, ``-ffast-math`` change
results), ``LDFLAGS`` (``-ffast-math`` at link time flushes denormals),
``CUDAARCHS`` (which GPU code is compiled)."""

NEUTRAL_FEATURES: Final[Mapping[str, str]] = {
    "OPENMP": NEUTRAL_CMAKE["GGML_OPENMP"],
}
"""Backend build features left out of the identity. The others are in: the
instruction sets a kernel is compiled for (``AVX2``, ``AVX512``, ``AMX_INT8`` ...),
``LLAMAFILE`` (its sgemm kernels), ``REPACK`` (interleaved weight layouts with
their own dot products), CUDA's ``ARCHS`` and kernel switches."""

NUMERIC_SWITCHES: Final[Mapping[str, str]] = {
    "GGML_CPU_FA_TILED": (
        "0 turns ggml-cpu's tiled flash attention off (llamad's llama.cpp patch 0003, the "
        "model option `deterministic`): prompts are summed in other groups, other bits"
    ),
    "GGML_CPU_TILED_MM": (
        "0 turns ggml-cpu's tiled K-quant matrix multiply off (the model option "
        "`deterministic`): batches of 8 rows or more take the vector kernel, other bits"
    ),
}
"""Environment variables the loaded libraries read at run time that change what
they compute. One set away from its default is part of the identity, as
``runtime.<variable>`` (a worker with ``deterministic`` keeps its rows apart)."""

_SOURCE_TREE = "source-tree-sha256"
_BOOL_WORDS: Final = {
    "ON": "ON",
    "TRUE": "ON",
    "YES": "ON",
    "Y": "ON",
    "OFF": "OFF",
    "FALSE": "OFF",
    "NO": "OFF",
    "N": "OFF",
}


class BuildRecordError(ValueError):
    """The extension's build record lacks what the identity needs (an older build_ffi.py)."""


@dataclass(frozen=True, slots=True)
class LoadedBuild:
    """What the loaded libraries report about themselves."""

    ggml_version: str
    ggml_commit: str
    backends: tuple[str, ...]
    """The ggml backend registries compiled in (or loaded), by name:
    ``("CPU",)``, ``("CUDA", "CPU")``."""
    devices: tuple[tuple[str, str], ...]
    """One ``(registry, device type)`` per device found in this process:
    ``("CPU", "cpu")``, ``("CUDA", "gpu")``. A GPU build with no GPU visible has
    no GPU device, and computes on the CPU."""
    features: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]
    """Each registry's build features, ``(registry, ((name, value), ...))``."""
    switches: tuple[tuple[str, str], ...] = ()
    """The :data:`NUMERIC_SWITCHES` this process set away from their default,
    ``(variable, value)``: the libraries read them from the environment."""


@dataclass(frozen=True, slots=True)
class BuildIdentity:
    """A libllama build, as named components and their digest.

    ``components`` are sorted ``(name, value)`` pairs; ``digest`` is
    ``sha256(BUILD_IDENTITY_DOMAIN || name "=" value "\\0" ...)`` over them.
    Make one with :meth:`of`.
    """

    components: tuple[tuple[str, str], ...]
    digest: bytes

    @classmethod
    def of(cls, components: Mapping[str, str]) -> BuildIdentity:
        """The identity made of ``components`` (names without ``=`` or NUL, values without NUL)."""
        pairs = tuple(sorted(components.items()))
        h = hashlib.sha256(BUILD_IDENTITY_DOMAIN)
        for name, value in pairs:
            if not isinstance(name, str) or not name or "=" in name or "\0" in name:
                raise ValueError(f"bad build component name {name!r}")
            if not isinstance(value, str) or "\0" in value:
                raise ValueError(f"bad value for build component {name!r}: {value!r}")
            h.update(name.encode() + b"=" + value.encode() + b"\0")
        return cls(pairs, h.digest())

    @property
    def hex(self) -> str:
        """The digest as hex, as logged and shown to operators."""
        return self.digest.hex()

    def as_dict(self) -> dict[str, str]:
        """The components by name."""
        return dict(self.components)

    def with_components(self, **changes: str) -> BuildIdentity:
        """Another build: these components changed (a test's or a tool's what-if)."""
        return BuildIdentity.of({**self.as_dict(), **changes})


def _bool_word(value: str) -> str:
    return _BOOL_WORDS.get(value.upper(), value)


def _cmake_settings(args: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """``-D`` settings by name (the last one wins, as in CMake) and any other arguments."""
    settings: dict[str, str] = {}
    others: list[str] = []
    it: Iterator[str] = iter(args)
    for arg in it:
        if arg.startswith("-D"):
            body = arg[2:] or next(it, "")
            name, _, value = body.partition("=")
            settings[name.split(":", 1)[0]] = _bool_word(value)
        elif arg == "-G":
            next(it, None)  # the generator: how the build runs
        elif not arg.startswith("-G"):
            others.append(arg)
    return settings, others


def _stamp_parts(stamp: str) -> tuple[list[str], dict[str, str], str | None]:
    """The stamp's configure arguments, configure variables, and source tree digest."""
    lines = stamp.splitlines()
    args = shlex.split(lines[0]) if lines else []
    env: dict[str, str] = {}
    tree: str | None = None
    for line in lines[1:]:
        name, sep, value = line.partition("=")
        if not sep:
            continue
        if name == _SOURCE_TREE:
            tree = value
        else:
            env[name] = value
    return args, env, tree


def _require(record: Mapping[str, Any], name: str, kind: type) -> Any:
    value = record.get(name)
    if not isinstance(value, kind):
        raise BuildRecordError(f"the build record has no {name!r}; rebuild with build_ffi.py")
    return value


def describe_build(record: Mapping[str, Any], loaded: LoadedBuild) -> dict[str, str]:
    """The named components of the identity of a build: ``record`` is what
    ``build_ffi.py`` wrote beside the extension, ``loaded`` what the libraries
    report (see the module doc for what is in, what is out and why)."""
    pin = _require(record, "pin", dict)
    backend = _require(record, "backend", str)
    stamp = _require(record, "configured", str)
    compilers = _require(record, "compilers", dict)
    args, env, tree = _stamp_parts(stamp)
    settings, others = _cmake_settings(args)

    out = {
        "pin": (
            f"llama.cpp {pin.get('llama_cpp_commit')} "
            f"(llama-cpp-python {pin.get('llama_cpp_python')})"
        ),
        # A tree given by path (LLAMAD_LLAMA_SRC) is not the pinned sdist:
        # its content is (scripts/native.py checks a given sdist against the pin).
        "source": f"tree sha256:{tree}" if tree else "pinned sdist",
        # llamad's patches to the source (scripts/patches/llama.cpp): one of
        # them changes which cells a token takes, hence the attention's sums.
        "patches": str(record.get("patches") or "none"),
        "backend": backend,
        "ggml": f"{loaded.ggml_version} ({loaded.ggml_commit})",
        "ggml.backends": ",".join(sorted(loaded.backends)),
        "ggml.devices": ",".join(sorted({f"{reg}:{kind}" for reg, kind in loaded.devices})),
        "cmake": " ".join(
            [
                *(f"{k}={v}" for k, v in sorted(settings.items()) if k not in NEUTRAL_CMAKE),
                *others,
            ]
        ),
        "compilers": ";".join(f"{lang}={name}" for lang, name in sorted(compilers.items())),
    }
    for name, value in env.items():
        if name not in NEUTRAL_ENV:
            out[f"env.{name}"] = value
    for reg, feats in loaded.features:
        kept = sorted(f"{n}={v}" for n, v in feats if n not in NEUTRAL_FEATURES)
        out[f"features.{reg}"] = " ".join(kept)
    for name, value in loaded.switches:
        out[f"runtime.{name}"] = value
    return out
