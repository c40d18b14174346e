#!/usr/bin/env python3
"""Fetch and build llamad's native inputs, once, into a cache keyed by the pins.

    python scripts/native.py llama [--tools]   # pinned llama.cpp shared libraries
    python scripts/native.py model             # the default GGUF
    python scripts/native.py prefix | model-path

Sources come only through ``pip download`` (the registries are the only network
this project may assume). Every step is idempotent and guarded by a file lock,
so concurrent setups on one machine wait for each other instead of racing.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from llamad import _pins, paths  # noqa: E402

BACKEND_FLAGS = {
    "cpu": [],
    "cuda": ["-DGGML_CUDA=ON"],
    "metal": ["-DGGML_METAL=ON"],
    "vulkan": ["-DGGML_VULKAN=ON"],
}
LIB_TARGETS = ["llama", "ggml"]
TOOL_TARGETS = ["llama-bench", "llama-server", "llama-cli"]


def log(msg: str) -> None:
    print(f"[native] {msg}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def pip_download(spec: str, dest: Path, *, sdist: bool) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(dest), spec]
    if sdist:
        cmd[4:4] = ["--no-binary", ":all:"]
    log("$ " + shlex.join(cmd))
    subprocess.run(cmd, check=True)
    name, _, version = spec.partition("==")
    stem = name.replace("-", "_")
    found = sorted(dest.glob(f"{stem}-{version}*"))
    if not found:
        raise SystemExit(f"pip download produced no file for {spec} in {dest}")
    return found[0]


def run(cmd: list[str], **kw: object) -> None:
    log("$ " + shlex.join(cmd))
    subprocess.run(cmd, check=True, **kw)  # type: ignore[call-overload]


def llama_source(prefix: Path) -> Path:
    src = prefix / "src"
    if (src / "include" / "llama.h").is_file():
        return src
    downloads = paths.cache_root() / "downloads"
    spec = f"llama-cpp-python=={_pins.LLAMA_CPP_PYTHON_VERSION}"
    sdist = next(
        iter(sorted(downloads.glob(f"llama_cpp_python-{_pins.LLAMA_CPP_PYTHON_VERSION}.tar.gz"))),
        None,
    )
    if sdist is None or sha256_file(sdist) != _pins.LLAMA_CPP_SDIST_SHA256:
        sdist = pip_download(spec, downloads, sdist=True)
    digest = sha256_file(sdist)
    if digest != _pins.LLAMA_CPP_SDIST_SHA256:
        raise SystemExit(f"{sdist.name}: sha256 {digest} != pinned {_pins.LLAMA_CPP_SDIST_SHA256}")
    member_root = f"llama_cpp_python-{_pins.LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp/"
    tmp = Path(tempfile.mkdtemp(prefix="src.", dir=prefix))
    log(f"extracting llama.cpp {_pins.LLAMA_CPP_COMMIT} from {sdist.name}")
    with tarfile.open(sdist) as tar:
        members = []
        for m in tar.getmembers():
            rel = m.name[len(member_root) :]
            # The sdist keeps llama.cpp as a git submodule; its `.git` pointer
            # file would make CMake ask git about a repository that is not there.
            if m.name.startswith(member_root) and rel and rel != ".git":
                m.name = m.name[len(member_root) :]
                members.append(m)
        tar.extractall(tmp, members=members, filter="data")
    shutil.rmtree(src, ignore_errors=True)
    tmp.rename(src)
    return src


def build_llama(backend: str, tools: bool) -> Path:
    prefix = paths.llama_prefix(backend)
    prefix.mkdir(parents=True, exist_ok=True)
    with locked(prefix / ".lock"):
        src = llama_source(prefix)
        build = prefix / "build"
        stamp = prefix / ".configured"
        if not stamp.is_file():
            flags = [
                "-DCMAKE_BUILD_TYPE=Release",
                "-DBUILD_SHARED_LIBS=ON",
                "-DGGML_NATIVE=" + os.environ.get("GGML_NATIVE", "ON"),
                "-DLLAMA_BUILD_TESTS=OFF",
                "-DLLAMA_BUILD_EXAMPLES=OFF",
                # Tools and the server are configured so `make bench` can build
                # llama-bench / llama-server from the same tree on demand; setup
                # builds only the libraries.
                "-DLLAMA_BUILD_TOOLS=ON",
                "-DLLAMA_BUILD_SERVER=ON",
                "-DLLAMA_BUILD_APP=OFF",
                "-DLLAMA_BUILD_UI=OFF",
                "-DLLAMA_USE_PREBUILT_UI=OFF",
                "-DLLAMA_OPENSSL=OFF",
                "-DLLAMA_CURL=OFF",
                *BACKEND_FLAGS[backend],
                *shlex.split(os.environ.get("CMAKE_ARGS", "")),
            ]
            run(["cmake", "-S", str(src), "-B", str(build), *flags])
            stamp.write_text(shlex.join(flags) + "\n")
        jobs = str(os.cpu_count() or 2)
        targets = LIB_TARGETS + (TOOL_TARGETS if tools else [])
        done = prefix / (".built-tools" if tools else ".built-libs")
        if not done.is_file():
            run(
                [
                    "cmake",
                    "--build",
                    str(build),
                    "--config",
                    "Release",
                    "-j",
                    jobs,
                    "--target",
                    *targets,
                ]
            )
            done.write_text("ok\n")
    return prefix


def fetch_model() -> Path:
    try:
        return paths.default_model_path()
    except paths.AssetMissing:
        pass
    if os.environ.get("LLAMAD_DEFAULT_MODEL"):
        raise SystemExit("LLAMAD_DEFAULT_MODEL points at a missing file")
    target = (
        paths.cache_root()
        / "models"
        / f"{_pins.DEFAULT_MODEL_WHEEL}-{_pins.DEFAULT_MODEL_WHEEL_VERSION}"
        / _pins.DEFAULT_MODEL_FILE
    )
    with locked(target.parent / ".lock"):
        if target.is_file():
            return target
        downloads = paths.cache_root() / "downloads"
        wheel = pip_download(
            f"{_pins.DEFAULT_MODEL_WHEEL}=={_pins.DEFAULT_MODEL_WHEEL_VERSION}",
            downloads,
            sdist=False,
        )
        tmp = target.with_suffix(".gguf.tmp")
        with (
            zipfile.ZipFile(wheel) as zf,
            zf.open(_pins.DEFAULT_MODEL_MEMBER) as src,
            open(tmp, "wb") as dst,
        ):
            shutil.copyfileobj(src, dst, 1 << 20)
        size = tmp.stat().st_size
        digest = sha256_file(tmp)
        if size != _pins.DEFAULT_MODEL_SIZE or digest != _pins.DEFAULT_MODEL_SHA256:
            tmp.unlink()
            raise SystemExit(f"default model mismatch: size {size}, sha256 {digest}")
        os.replace(tmp, target)
        wheel.unlink()  # the extracted GGUF is all we keep
        log(f"default model at {target}")
    return target


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    p_llama = sub.add_parser("llama")
    p_llama.add_argument(
        "--tools", action="store_true", help="also build llama-bench and llama-server"
    )
    sub.add_parser("model")
    sub.add_parser("prefix")
    sub.add_parser("model-path")
    args = ap.parse_args()
    backend = paths.backend()
    if args.cmd == "llama":
        print(build_llama(backend, args.tools))
    elif args.cmd == "model":
        print(fetch_model())
    elif args.cmd == "prefix":
        print(paths.llama_prefix(backend))
    elif args.cmd == "model-path":
        print(paths.default_model_path())


if __name__ == "__main__":
    main()
