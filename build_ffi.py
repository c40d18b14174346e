#!/usr/bin/env python3
"""Build ``llamad.llama_ffi._llama``: an API-mode cffi extension over ``llama.h``.

API mode means the C compiler checks every declaration in ``cdef.h`` against the
pinned header, so struct layouts and signatures are never guessed. The library
directory of the pinned build is baked in as an rpath: the extension finds
``libllama`` at run time without ``LD_LIBRARY_PATH``.

Skips the build when the extension is newer than its inputs.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from pathlib import Path

import cffi

ROOT = Path(__file__).resolve().parent
PKG = ROOT / "src" / "llamad" / "llama_ffi"
sys.path.insert(0, str(ROOT / "src"))

from llamad import paths  # noqa: E402

CDEF = PKG / "cdef.h"
SHIM = PKG / "shim.c"


def lib_dir(prefix: Path) -> Path:
    build = prefix / "build"
    for candidate in (build / "bin", build / "lib", build / "src"):
        if any(candidate.glob("libllama.*")):
            return candidate
    raise SystemExit(f"libllama not found under {build}; run `scripts/native.py llama`")


def main() -> None:
    prefix = paths.llama_prefix()
    src = prefix / "src"
    libs = lib_dir(prefix)
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    target = PKG / f"_llama{suffix}"
    inputs = [CDEF, SHIM, Path(__file__), src / "include" / "llama.h", libs / "libllama.so"]
    newest = max(p.stat().st_mtime for p in inputs if p.exists())
    if target.exists() and target.stat().st_mtime >= newest and "--force" not in sys.argv:
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
    # mapped and would crash): copy beside it, then rename over it.
    staged = target.with_name(target.name + ".tmp")
    shutil.copy2(built, staged)
    os.replace(staged, target)
    print(f"[ffi] built {target.relative_to(ROOT)} (rpath {libs})")


if __name__ == "__main__":
    main()
