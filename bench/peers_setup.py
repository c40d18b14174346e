"""Set up the peers llamad is measured against, once, cached like llama.cpp.

    python -m bench.peers_setup [--tools-only | --python-only] [--print]

- ``llama-server`` and ``llama-bench``: built from the same pinned tree and the
  same configuration as the libraries llamad loads (``scripts/native.py llama
  --tools``; the tools are extra targets of that one build folder, the
  libraries are not rebuilt).
- ``llama-cpp-python`` at the pinned version, in its own virtual environment
  under ``<cache>/peers/llama-cpp-python-<version>-<backend>-<config key>``,
  built from the pinned sdist (checked against its sha256) with the same CMake
  flags and compiler flags as llamad's build (so ``-march=native`` without AMX
  on an AMX host, exactly as ``scripts/native.py`` decides).

Idempotent: a venv is used only once its ``.installed`` stamp (written last)
matches the configuration; a lock keeps two setups from racing. ``--print``
prints the peers' paths as JSON, building nothing.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from llamad import _pins, paths  # noqa: E402

STAMP = ".installed"
# Flags of llamad's configure that mean something to llama-cpp-python's own
# CMakeLists (it sets the LLAMA_BUILD_* switches itself).
PASSED_PREFIXES = (
    "-DGGML_",
    "-DCMAKE_BUILD_TYPE",
    "-DCMAKE_CUDA",
    "-DLLAMA_CURL",
    "-DLLAMA_OPENSSL",
)


@functools.cache
def native() -> ModuleType:
    """scripts/native.py as a module (it is a script, not a package), loaded once."""
    spec = importlib.util.spec_from_file_location("llamad_native", ROOT / "scripts" / "native.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("llamad_native", module)
    spec.loader.exec_module(module)
    return module


def log(msg: str) -> None:
    print(f"[peers] {msg}", file=sys.stderr, flush=True)


def llama_tools() -> dict[str, str]:
    """Paths of llama-server and llama-bench in the current configuration's build."""
    nat = native()
    prefix = nat.current_prefix()
    bin_dir = prefix / "build" / "bin"
    return {
        "llama-server": str(bin_dir / "llama-server"),
        "llama-bench": str(bin_dir / "llama-bench"),
    }


def python_peer_plan() -> tuple[Path, str, dict[str, str]]:
    """(venv folder, stamp text, build environment) of llama-cpp-python for the
    configuration this environment asks for."""
    nat = native()
    config = nat.build_config(paths.backend(), os.environ)
    cmake_args = [f for f in config.flags if f.startswith(PASSED_PREFIXES)]
    env_items = dict(config.env)
    stamp_lines = [
        f"llama-cpp-python=={_pins.LLAMA_CPP_PYTHON_VERSION}",
        f"sdist-sha256={_pins.LLAMA_CPP_SDIST_SHA256}",
        "CMAKE_ARGS=" + shlex.join(cmake_args),
        *(f"{k}={v}" for k, v in sorted(env_items.items())),
        f"python={sys.version.split()[0]}",
        f"cpu-flags-sha256={cpu_flags_digest()}",
    ]
    stamp = "\n".join(stamp_lines) + "\n"
    key = hashlib.sha256(stamp.encode()).hexdigest()[:10]
    name = f"llama-cpp-python-{_pins.LLAMA_CPP_PYTHON_VERSION}-{paths.backend()}-{key}"
    env = config.cmake_env(os.environ)
    env["CMAKE_ARGS"] = shlex.join(cmake_args)
    env["CMAKE_BUILD_PARALLEL_LEVEL"] = str(os.cpu_count() or 2)
    env["FORCE_CMAKE"] = "1"
    return paths.cache_root() / "peers" / name, stamp, env


def cpu_flags_digest() -> str:
    """Digest of this CPU's feature flags: -march=native compiles for them, so a
    cache shared by machines (a home directory on NFS) never hands one CPU's
    build to another."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    line = next((ln for ln in text.splitlines() if ln.startswith(("flags", "Features"))), "")
    flags = " ".join(sorted(line.partition(":")[2].split()))
    return hashlib.sha256(flags.encode()).hexdigest()[:16]


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def python_peer(*, build: bool) -> tuple[Path | None, str]:
    """The llama-cpp-python venv's interpreter (None if not there) and why not."""
    venv, stamp, env = python_peer_plan()
    stamp_file = venv / STAMP
    if stamp_file.is_file() and stamp_file.read_text() == stamp:
        return venv_python(venv), ""
    failed = venv.with_name(venv.name + ".failed")
    if not build:
        if failed.is_file():
            return None, f"its setup failed: {failed.read_text().strip()}"
        return None, f"llama-cpp-python is not set up at {venv}; run `python -m bench.peers_setup`"
    with native().locked(venv.parent / f"{venv.name}.lock"):
        if stamp_file.is_file() and stamp_file.read_text() == stamp:
            return venv_python(venv), ""
        shutil.rmtree(venv, ignore_errors=True)
        sdist = native().pinned_sdist(None)
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", str(venv)], check=True)
        py = str(venv_python(venv))
        subprocess.run([py, "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True)
        cmd = [py, "-m", "pip", "install", "--no-cache-dir", "-v", str(sdist)]
        log(f"CMAKE_ARGS={env['CMAKE_ARGS']!r} CFLAGS={env.get('CFLAGS', '')!r}")
        log("$ " + shlex.join(cmd))
        proc = subprocess.run(cmd, env=env, check=False)
        if proc.returncode != 0:
            why = f"pip install of the pinned sdist failed (exit {proc.returncode}; see its output)"
            failed.write_text(why + "\n")
            return None, why
        check = subprocess.run(
            [py, "-c", "import llama_cpp; print(llama_cpp.__version__)"],
            capture_output=True,
            text=True,
            check=False,
        )
        got = check.stdout.strip()
        if check.returncode != 0 or got != _pins.LLAMA_CPP_PYTHON_VERSION:
            why = (
                f"llama_cpp does not import as {_pins.LLAMA_CPP_PYTHON_VERSION}: "
                f"{got!r} {check.stderr[-500:]}"
            )
            failed.write_text(why + "\n")
            return None, why
        failed.unlink(missing_ok=True)
        stamp_file.write_text(stamp)
    return venv_python(venv), ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--tools-only", action="store_true")
    group.add_argument("--python-only", action="store_true")
    group.add_argument("--print", action="store_true", help="print the peers' paths, build nothing")
    args = ap.parse_args()
    if args.print:
        py, why = python_peer(build=False)
        print(json.dumps({**llama_tools(), "llama-cpp-python": str(py) if py else why}, indent=2))
        return 0
    rc = 0
    if not args.python_only:
        nat = native()
        nat.build_llama(paths.backend(), True)
        log(f"tools: {llama_tools()}")
    if not args.tools_only:
        py, why = python_peer(build=True)
        if py is None:
            log(f"llama-cpp-python: {why}")
            rc = 1
        else:
            log(f"llama-cpp-python: {py}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
