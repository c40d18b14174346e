#!/usr/bin/env python3
"""Build ``llamad.llama_ffi._llama``: an API-mode cffi extension over ``llama.h``.

API mode means the C compiler checks every declaration in ``cdef.h`` against the
pinned header, so struct layouts and signatures are never guessed. The library
directory of the pinned build is baked in as an rpath: the extension finds
``libllama`` at run time without ``LD_LIBRARY_PATH``.

The build folder is the one ``scripts/native.py llama`` built and checked for
this environment's configuration (``LLAMA_BACKEND``, ``CMAKE_ARGS``, compilers);
an unchecked folder is refused. Beside the extension, ``<extension>.build.json``
records what it was built from: the backend, the library folder it links
against, the sha256 of every input, and what the libraries were built from
(the pin, the folder's ``.configured`` stamp, the compilers CMake found),
which ``llamad.llama_ffi.build_info`` reads at run time for the build's
cache identity. The build is skipped only when that record matches exactly,
so switching backend or configuration relinks.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import sys
import sysconfig
from pathlib import Path
from types import ModuleType
from typing import Any

import cffi

ROOT = Path(__file__).resolve().parent
PKG = ROOT / "src" / "llamad" / "llama_ffi"
sys.path.insert(0, str(ROOT / "src"))

from llamad import _pins, paths  # noqa: E402

CDEF = PKG / "cdef.h"
SHIM = PKG / "shim.c"
STAMP_SUFFIX = ".build.json"


def _native() -> ModuleType:
    """scripts/native.py, which owns the build folder's key and check."""
    path = ROOT / "scripts" / "native.py"
    spec = importlib.util.spec_from_file_location("llamad_native_build", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


native = _native()


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


_COMPILER_FIELD = re.compile(r'^set\(CMAKE_(\w+?)_COMPILER_(ID|VERSION) "([^"]*)"\)$', re.M)


def compilers(build: Path) -> dict[str, str]:
    """The compilers CMake configured ``build`` with, by language
    (``{"C": "GNU 12.2.0", "CXX": "GNU 12.2.0"}``), from the
    ``CMakeFiles/<cmake version>/CMake<LANG>Compiler.cmake`` files CMake writes
    when it detects them; the newest such folder if CMake was upgraded. Empty
    when there are none. Ids and versions, never paths: another install of
    the same compiler is the same compiler."""
    folders = [p.parent for p in build.glob("CMakeFiles/*/CMakeCCompiler.cmake")]
    if not folders:
        return {}
    newest = max(folders, key=lambda p: (p / "CMakeCCompiler.cmake").stat().st_mtime_ns)
    found: dict[str, dict[str, str]] = {}
    for path in sorted(newest.glob("CMake*Compiler.cmake")):
        for lang, field, value in _COMPILER_FIELD.findall(path.read_text(errors="replace")):
            found.setdefault(lang, {})[field] = value
    return {
        lang: f"{f['ID']} {f.get('VERSION', '')}".strip()
        for lang, f in sorted(found.items())
        if f.get("ID")
    }


def configured(prefix: Path) -> str:
    """The ``.configured`` stamp scripts/native.py wrote when it configured ``prefix``."""
    stamp = prefix / ".configured"
    try:
        return stamp.read_text()
    except OSError as exc:
        raise native.BuildRefused(
            f"{stamp}: cannot read the build's configuration ({exc}); run `scripts/native.py llama`"
        ) from exc


def _patches_in(src: Path) -> str:
    marker = src / native.PATCHED
    return marker.read_text().strip() if marker.is_file() else ""


def build_record(backend: str, prefix: Path, src: Path, libs: Path) -> dict[str, Any]:
    """What an extension built now would be built from, and what its libraries were built
    from (the ``pin``, the ``configured`` stamp and the ``compilers``: read at run time as
    part of the build's cache identity, see ``llamad.llama_ffi.build_info``)."""
    inputs = {
        "cdef.h": CDEF,
        "shim.c": SHIM,
        "build_ffi.py": Path(__file__),
        "llama.h": src / "include" / "llama.h",
        "libllama": (libs / "libllama.so").resolve(),
    }
    return {
        "backend": backend,
        "lib_dir": str(libs),
        "sha256": {name: _sha256(p) for name, p in inputs.items() if p.is_file()},
        "pin": {
            "llama_cpp_python": _pins.LLAMA_CPP_PYTHON_VERSION,
            "llama_cpp_commit": _pins.LLAMA_CPP_COMMIT,
            "sdist_sha256": _pins.LLAMA_CPP_SDIST_SHA256,
        },
        # The patches the built source carries (scripts/native.py marks the
        # extracted tree with their digest): patch 0001 changes the numbers.
        "patches": _patches_in(src),
        "configured": configured(prefix),
        "compilers": compilers(prefix / "build"),
    }


def stamp_path(target: Path) -> Path:
    return target.with_name(target.name + STAMP_SUFFIX)


def up_to_date(target: Path, record: dict[str, Any]) -> bool:
    """The extension exists and was built from exactly ``record``."""
    try:
        return target.is_file() and json.loads(stamp_path(target).read_text()) == record
    except (OSError, ValueError):
        return False


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    backend = paths.backend()
    prefix = native.build_prefix(native.build_config(backend, os.environ))
    native.require_checked(prefix)
    src = prefix / "src"
    libs = native.lib_dir(prefix)
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    target = PKG / f"_llama{suffix}"
    record = build_record(backend, prefix, src, libs)
    if "--force" not in argv and up_to_date(target, record):
        print(f"[ffi] up to date: {target.relative_to(ROOT)}")
        return

    ffi = cffi.FFI()
    ffi.cdef(CDEF.read_text())
    ffi.set_source(
        "llamad.llama_ffi._llama",
        '#include "llama.h"\n' + (SHIM.read_text() if SHIM.exists() else ""),
        include_dirs=[str(src / "include"), str(src / "ggml" / "include")],
        library_dirs=[str(libs)],
        libraries=["llama", "ggml", "ggml-base"],
        extra_compile_args=["-O2"],
        extra_link_args=[f"-Wl,-rpath,{libs}"],
    )
    tmp = ROOT / "build" / "ffi"
    built = Path(ffi.compile(tmpdir=str(tmp), verbose=False))
    # Never rewrite a loaded library in place (a running process has it
    # mapped and would crash): copy beside it, then rename over it. The
    # record goes last, so a build cut short is never taken as up to date.
    staged = target.with_name(target.name + ".tmp")
    shutil.copy2(built, staged)
    os.replace(staged, target)
    staged_stamp = stamp_path(target).with_name(stamp_path(target).name + ".tmp")
    staged_stamp.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    os.replace(staged_stamp, stamp_path(target))
    print(f"[ffi] built {target.relative_to(ROOT)} ({backend}, rpath {libs})")


if __name__ == "__main__":
    main()
