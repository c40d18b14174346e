"""The build path: one folder per configuration, checked libraries, relinks that follow them.

scripts/native.py keys llama.cpp's build folder by every configure input and
refuses a build whose libraries cannot tokenize; build_ffi.py relinks when the
library folder (or any input) changes. Nothing here compiles llama.cpp: cmake
is replaced by a recorder, and the check runs against small stub libraries.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import pytest

from llamad import _pins, paths

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]


def _load(name: str, path: Path) -> ModuleType:
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


build_ffi = _load("llamad_build_ffi", ROOT / "build_ffi.py")
native = build_ffi.native  # the one scripts/native.py module build_ffi uses

# The stamp every default build wrote before configure inputs were keyed: the
# default configuration's folder must keep matching it (no rebuild).
LEGACY_DEFAULT_STAMP = (
    "-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DGGML_NATIVE=ON "
    "-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON "
    "-DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF "
    "-DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF\n"
)

CONFIGURE_INPUTS = [
    ("CMAKE_ARGS", "-DGGML_BLAS=ON"),
    ("GGML_NATIVE", "OFF"),
    ("CC", "/opt/static-gcc/bin/gcc"),
    ("CXX", "/opt/static-gcc/bin/g++"),
    ("CUDAHOSTCXX", "/usr/bin/g++"),
    ("CUDACXX", "/usr/local/cuda/bin/nvcc"),
    ("CUDAARCHS", "89"),
    ("CFLAGS", "-O3"),
    ("CXXFLAGS", "-O3"),
    ("CUDAFLAGS", "-lineinfo"),
    ("LDFLAGS", "-static-libstdc++"),
    ("CMAKE_GENERATOR", "Ninja"),
]


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LLAMAD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(native, "host_has_amx", lambda: False)
    monkeypatch.setattr(native, "detect_cuda_archs", lambda: ["90"])


def _prefix(backend: str = "cpu", **env: str) -> Path:
    return Path(native.build_prefix(native.build_config(backend, env)))


# ---------------------------------------------------------------------------
# The key


def test_default_configuration_keeps_the_existing_folder_and_stamp() -> None:
    config = native.build_config("cpu", {})
    assert config.stamp == LEGACY_DEFAULT_STAMP
    assert _prefix() == paths.llama_prefix("cpu")


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
@pytest.mark.parametrize(("name", "value"), CONFIGURE_INPUTS)
def test_every_configure_input_gets_its_own_folder(backend: str, name: str, value: str) -> None:
    default = _prefix(backend)
    changed = _prefix(backend, **{name: value})
    assert changed != default
    assert changed.parent == default.parent
    assert changed.name.startswith(default.name + "-")
    assert value in native.build_config(backend, {name: value}).stamp


def test_distinct_values_of_one_input_get_distinct_folders() -> None:
    seen = {
        _prefix("cuda", CMAKE_ARGS=f"-DCMAKE_CUDA_ARCHITECTURES={arch}")
        for arch in ("80", "86", "89", "90")
    }
    assert len(seen) == 4
    assert _prefix(CC="/usr/bin/gcc") != _prefix(CC="/usr/bin/clang")


def test_an_empty_variable_is_the_same_as_an_unset_one() -> None:
    assert _prefix(CC="", CMAKE_ARGS="") == _prefix()


def test_amx_host_builds_without_amx_and_user_flags_come_last(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(native, "host_has_amx", lambda: True)
    env = dict(native.build_config("cpu", {"CXXFLAGS": "-mamx-int8"}).env)
    assert env["CFLAGS"] == native.NO_AMX
    assert env["CXXFLAGS"] == f"{native.NO_AMX} -mamx-int8"
    # On such a host the AMX-free build is the default one: the plain folder.
    assert _prefix() == paths.llama_prefix("cpu")
    # GGML_NATIVE=OFF does not compile the host's AMX in, so nothing to leave out.
    assert "CFLAGS" not in dict(native.build_config("cpu", {"GGML_NATIVE": "OFF"}).env)


def test_a_source_tree_given_by_path_is_keyed_by_its_content(tmp_path: Path) -> None:
    tree = tmp_path / "llama.cpp"
    (tree / "include").mkdir(parents=True)
    (tree / "include" / "llama.h").write_text("/* one */\n")
    first = _prefix(LLAMAD_LLAMA_SRC=str(tree))
    assert first != _prefix()
    assert _prefix(LLAMAD_LLAMA_SRC=str(tree)) == first
    (tree / "include" / "llama.h").write_text("/* two */\n")
    assert _prefix(LLAMAD_LLAMA_SRC=str(tree)) != first
    # An extracted sdist is accepted too: the tree is its vendor/llama.cpp.
    sdist_root = tmp_path / "sdist"
    shutil.copytree(tree, sdist_root / "vendor" / "llama.cpp")
    assert native.source_tree(sdist_root) == sdist_root / "vendor" / "llama.cpp"


def test_a_given_sdist_must_be_the_pinned_one(tmp_path: Path) -> None:
    fake = tmp_path / "llama_cpp_python-0.3.36.tar.gz"
    fake.write_bytes(b"not the pinned sdist")
    config = native.build_config("cpu", {"LLAMAD_LLAMA_SRC": str(fake)})
    # A verified sdist is the pinned source: it does not change the key.
    assert native.build_prefix(config) == paths.llama_prefix("cpu")
    with pytest.raises(native.BuildRefused, match="sha256"):
        native.pinned_sdist(fake)


# ---------------------------------------------------------------------------
# llamad's patches to llama.cpp


def test_the_pinned_patch_digest_is_the_patches_on_disk() -> None:
    assert native.patch_files(), "scripts/patches/llama.cpp holds llamad's patches"
    assert native.patches_digest() == _pins.LLAMA_CPP_PATCHES_SHA256, (
        "scripts/patches/llama.cpp changed: set _pins.LLAMA_CPP_PATCHES_SHA256 to "
        "native.patches_digest()"
    )


def test_every_patch_says_what_it_changes_and_why() -> None:
    """Each patch opens as a change sent upstream would: a subject, then the
    problem, the change and its cost, before the diff. (That each applies to
    the pinned tree is checked where it is applied: setup fails otherwise.)"""
    for path in native.patch_files():
        head = path.read_text().split("\n---\n", 1)[0].splitlines()
        assert head[1].startswith("Subject: [PATCH] "), path.name
        assert len(head) > 10, f"{path.name} says too little about why"


def test_extracted_source_is_patched_and_another_patch_set_extracts_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = tmp_path / "llama.cpp"
    (tree / "include").mkdir(parents=True)
    (tree / "include" / "llama.h").write_text("int x;\n")
    patches = tmp_path / "patches"
    patches.mkdir()
    (patches / "0001-a.patch").write_text(
        "Subject: [PATCH] a\n---\n"
        "--- a/include/llama.h\n+++ b/include/llama.h\n@@ -1 +1 @@\n-int x;\n+int y;\n"
    )
    monkeypatch.setattr(native, "PATCH_DIR", patches)
    monkeypatch.setattr(native, "log", lambda msg: None)
    config = native.build_config("cpu", {"LLAMAD_LLAMA_SRC": str(tree)})
    prefix = tmp_path / "prefix"
    prefix.mkdir()
    src = native.llama_source(prefix, config)
    assert (src / "include" / "llama.h").read_text() == "int y;\n"
    assert (src / native.PATCHED).read_text().strip() == native.patches_digest()
    (prefix / "build").mkdir()
    (prefix / ".built-libs").write_text("ok\n")
    # The same patch set: the extracted tree is reused as it is.
    assert native.llama_source(prefix, config) == src
    assert (prefix / ".built-libs").exists()
    # Another patch set: extracted and patched again, and the old build goes.
    (patches / "0002-b.patch").write_text(
        "Subject: [PATCH] b\n---\n"
        "--- a/include/llama.h\n+++ b/include/llama.h\n@@ -1 +1 @@\n-int y;\n+int z;\n"
    )
    src = native.llama_source(prefix, config)
    assert (src / "include" / "llama.h").read_text() == "int z;\n"
    assert not (prefix / "build").exists() and not (prefix / ".built-libs").exists()


def test_a_patch_that_does_not_apply_fails_the_setup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = tmp_path / "llama.cpp"
    (tree / "include").mkdir(parents=True)
    (tree / "include" / "llama.h").write_text("int q;\n")
    patches = tmp_path / "patches"
    patches.mkdir()
    (patches / "0001-a.patch").write_text(
        "--- a/include/llama.h\n+++ b/include/llama.h\n@@ -1 +1 @@\n-int x;\n+int y;\n"
    )
    monkeypatch.setattr(native, "PATCH_DIR", patches)
    monkeypatch.setattr(native, "log", lambda msg: None)
    config = native.build_config("cpu", {"LLAMAD_LLAMA_SRC": str(tree)})
    (tmp_path / "prefix").mkdir()
    with pytest.raises(subprocess.CalledProcessError):
        native.llama_source(tmp_path / "prefix", config)
    assert not (tmp_path / "prefix" / "src").exists()


# ---------------------------------------------------------------------------
# CUDA architectures


def test_cuda_asks_for_the_visible_gpus_architectures_not_native() -> None:
    flags = native.build_config("cuda", {}).flags
    assert "-DCMAKE_CUDA_ARCHITECTURES=90" in flags


def test_cuda_without_a_visible_gpu_or_architectures_is_refused_with_the_fix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(native, "detect_cuda_archs", list)
    with pytest.raises(native.BuildRefused, match="CMAKE_CUDA_ARCHITECTURES=90"):
        native.build_config("cuda", {})
    # Named architectures need no GPU, and have a folder of their own.
    config = native.build_config("cuda", {"CMAKE_ARGS": "-DCMAKE_CUDA_ARCHITECTURES=90"})
    assert [f for f in config.flags if "CUDA_ARCH" in f] == ["-DCMAKE_CUDA_ARCHITECTURES=90"]
    assert native.build_prefix(config) != paths.llama_prefix("cuda")
    assert not any("CUDA_ARCH" in f for f in native.build_config("cuda", {"CUDAARCHS": "90"}).flags)


# ---------------------------------------------------------------------------
# Building (cmake replaced by a recorder)


class FakeCmake:
    """Records cmake invocations; a build writes the libraries cmake would."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.envs: list[dict[str, str]] = []

    def run(self, cmd: list[str], **kw: Any) -> None:
        self.calls.append(cmd)
        self.envs.append(dict(kw.get("env") or {}))
        if cmd[1] == "-S":
            build = Path(cmd[cmd.index("-B") + 1])
            build.mkdir(parents=True, exist_ok=True)
            (build / "CMakeCache.txt").write_text(" ".join(cmd))
        elif cmd[1] == "--build":
            bin_dir = Path(cmd[2]) / "bin"
            bin_dir.mkdir(parents=True, exist_ok=True)
            (bin_dir / "libllama.so").write_bytes(b"lib built by " + cmd[2].encode())

    @property
    def configures(self) -> list[list[str]]:
        return [c for c in self.calls if c[1] == "-S"]


@pytest.fixture
def cmake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[FakeCmake]:
    fake = FakeCmake()
    src = tmp_path / "src"
    (src / "include").mkdir(parents=True)
    (src / "include" / "llama.h").write_text("/* fake */\n")
    monkeypatch.setattr(native, "run", fake.run)
    monkeypatch.setattr(native, "llama_source", lambda prefix, config: src)
    monkeypatch.setattr(native, "check_build", lambda prefix, src, environ: "passed\n")
    yield fake


def test_an_unchanged_configuration_builds_once(cmake: FakeCmake) -> None:
    prefix = native.build_llama("cpu", False, {})
    assert len(cmake.calls) == 2  # configure, build
    assert (prefix / ".configured").read_text() == LEGACY_DEFAULT_STAMP
    assert native.build_llama("cpu", False, {}) == prefix
    assert len(cmake.calls) == 2


def test_configure_variables_reach_cmake_exactly_as_stamped(cmake: FakeCmake) -> None:
    env = {"CC": "/usr/bin/gcc", "CXX": "/usr/bin/g++", "PATH": "/usr/bin"}
    prefix = native.build_llama("cpu", False, env)
    assert prefix != paths.llama_prefix("cpu")
    configure_env = cmake.envs[0]
    assert configure_env["CC"] == "/usr/bin/gcc"
    assert configure_env["CXX"] == "/usr/bin/g++"
    assert configure_env["PATH"] == "/usr/bin"
    assert "CC=/usr/bin/gcc\n" in (prefix / ".configured").read_text()


def test_changing_an_input_never_reuses_the_old_build(cmake: FakeCmake) -> None:
    first = native.build_llama("cpu", False, {})
    second = native.build_llama("cpu", False, {"CMAKE_ARGS": "-DGGML_BLAS=ON"})
    assert second != first
    assert len(cmake.configures) == 2
    assert "-DGGML_BLAS=ON" in cmake.configures[1]
    stamp = (second / ".configured").read_text()
    assert stamp.startswith(LEGACY_DEFAULT_STAMP.strip() + " -DGGML_BLAS=ON")
    # The old configuration is still there, untouched, for switching back.
    assert native.build_llama("cpu", False, {}) == first
    assert len(cmake.calls) == 4


def test_a_stale_stamp_in_the_folder_forces_a_clean_reconfigure(cmake: FakeCmake) -> None:
    prefix = native.build_llama("cpu", False, {})
    (prefix / ".configured").write_text("-DCMAKE_BUILD_TYPE=Debug\n")  # an older default
    leftover = prefix / "build" / "stale.o"
    leftover.write_text("old")
    assert native.build_llama("cpu", False, {}) == prefix
    assert not leftover.exists()
    assert len(cmake.configures) == 2
    assert (prefix / ".configured").read_text() == LEGACY_DEFAULT_STAMP
    assert len([c for c in cmake.calls if c[1] == "--build"]) == 2


def test_a_refused_build_is_never_marked_checked_and_stays_refused(
    cmake: FakeCmake, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(prefix: Path, src: Path, environ: object) -> str:
        raise native.BuildRefused("fails its check: the child was killed by SIGSEGV")

    monkeypatch.setattr(native, "check_build", refuse)
    with pytest.raises(native.BuildRefused, match="SIGSEGV"):
        native.build_llama("cpu", False, {})
    prefix = paths.llama_prefix("cpu")
    assert not (prefix / native.CHECKED).exists()
    with pytest.raises(native.BuildRefused):
        native.build_llama("cpu", False, {})
    with pytest.raises(native.BuildRefused, match="has not passed its check"):
        native.require_checked(prefix)


# ---------------------------------------------------------------------------
# The check, against stub libraries (a C compiler, no llama.cpp)

STUB_HEADER = """
#include <stdbool.h>
#include <stdint.h>
typedef int32_t llama_token;
struct llama_model;
struct llama_vocab;
struct llama_model_params { int32_t n_gpu_layers; bool vocab_only; };
void llama_backend_init(void);
void llama_backend_free(void);
struct llama_model_params llama_model_default_params(void);
struct llama_model * llama_model_load_from_file(const char * path, struct llama_model_params p);
void llama_model_free(struct llama_model * model);
const struct llama_vocab * llama_model_get_vocab(const struct llama_model * model);
int32_t llama_tokenize(const struct llama_vocab * vocab, const char * text, int32_t text_len,
                       llama_token * tokens, int32_t n_tokens_max, bool add_special,
                       bool parse_special);
int32_t llama_detokenize(const struct llama_vocab * vocab, const llama_token * tokens,
                         int32_t n_tokens, char * text, int32_t text_len_max,
                         bool remove_special, bool unparse_special);
"""

# One token per byte; TOKENIZE_BODY decides what tokenizing does.
STUB_LIB = """
#include <signal.h>
#include <stdlib.h>
#include "llama.h"
static int model_;
void llama_backend_init(void) {}
void llama_backend_free(void) {}
struct llama_model_params llama_model_default_params(void) {
    struct llama_model_params p = {0, false};
    return p;
}
struct llama_model * llama_model_load_from_file(const char * path, struct llama_model_params p) {
    (void) path;
    return p.vocab_only ? (struct llama_model *) &model_ : NULL;
}
void llama_model_free(struct llama_model * model) { (void) model; }
const struct llama_vocab * llama_model_get_vocab(const struct llama_model * model) {
    return (const struct llama_vocab *) model;
}
int32_t llama_tokenize(const struct llama_vocab * vocab, const char * text, int32_t text_len,
                       llama_token * tokens, int32_t n_tokens_max, bool add_special,
                       bool parse_special) {
    (void) vocab; (void) add_special; (void) parse_special;
    TOKENIZE_BODY
    if (text_len > n_tokens_max) return -text_len;
    for (int32_t i = 0; i < text_len; i++) tokens[i] = (unsigned char) text[i];
    return text_len;
}
int32_t llama_detokenize(const struct llama_vocab * vocab, const llama_token * tokens,
                         int32_t n_tokens, char * text, int32_t text_len_max,
                         bool remove_special, bool unparse_special) {
    (void) vocab; (void) remove_special; (void) unparse_special;
    if (n_tokens > text_len_max) return -n_tokens;
    for (int32_t i = 0; i < n_tokens; i++) text[i] = (char) tokens[i];
    return n_tokens;
}
"""


def _stub_build(tmp_path: Path, tokenize_body: str) -> tuple[Path, Path]:
    """A folder laid out like a llama.cpp build, its libllama a stub; returns (prefix, src)."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    prefix = tmp_path / "prefix"
    src = prefix / "src"
    (src / "include").mkdir(parents=True)
    (src / "ggml" / "include").mkdir(parents=True)
    (src / "include" / "llama.h").write_text(STUB_HEADER)
    (src / "models").mkdir()
    (src / "models" / "ggml-vocab-llama-bpe.gguf").write_bytes(b"GGUF")
    libs = prefix / "build" / "bin"
    libs.mkdir(parents=True)
    stub = prefix / "stub.c"
    stub.write_text(STUB_LIB.replace("TOKENIZE_BODY", tokenize_body))
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-I", str(src / "include"), "-o", str(libs / "libllama.so"),
         str(stub)],
        check=True,
    )  # fmt: skip
    return prefix, src


def test_check_passes_a_library_that_tokenizes(tmp_path: Path) -> None:
    prefix, src = _stub_build(tmp_path, "")
    assert native.check_build(prefix, src, {}).startswith("passed")


def test_check_refuses_a_library_that_crashes_in_the_tokenizer(tmp_path: Path) -> None:
    # What a libstdc++-static toolchain's build did: every load died in std::regex.
    prefix, src = _stub_build(tmp_path, "raise(SIGSEGV);")
    with pytest.raises(native.BuildRefused) as info:
        native.check_build(prefix, src, {})
    message = str(info.value)
    assert "SIGSEGV" in message
    assert "vocab_only" in message
    assert "CC=/usr/bin/gcc CXX=/usr/bin/g++" in message


def test_check_refuses_a_library_that_mangles_text(tmp_path: Path) -> None:
    prefix, src = _stub_build(tmp_path, "if (text_len > 3) text_len = 3;")
    with pytest.raises(native.BuildRefused, match="changed the text"):
        native.check_build(prefix, src, {})


def test_check_refuses_a_library_that_cannot_load_a_vocabulary(tmp_path: Path) -> None:
    prefix, src = _stub_build(tmp_path, "exit(7);")
    with pytest.raises(native.BuildRefused, match="status 7"):
        native.check_build(prefix, src, {})


# ---------------------------------------------------------------------------
# build_ffi: the up-to-date check follows the library folder


class FakeFFI:
    """Stands in for cffi.FFI: compiling writes a file naming the lib dir it links."""

    compiles: ClassVar[list[str]] = []

    def cdef(self, text: str) -> None:
        pass

    def set_source(self, name: str, source: str, **kw: Any) -> None:
        self.lib_dir = kw["library_dirs"][0]

    def compile(self, tmpdir: str, verbose: bool) -> str:
        out = Path(tmpdir) / "ext.so"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(self.lib_dir)
        FakeFFI.compiles.append(self.lib_dir)
        return str(out)


def _checked_build(root: Path, name: str) -> Path:
    prefix = root / name
    (prefix / "src" / "include").mkdir(parents=True)
    (prefix / "src" / "include" / "llama.h").write_text("/* llama.h */\n")
    (prefix / "build" / "bin").mkdir(parents=True)
    # The same bytes in every folder: only the folder tells the builds apart.
    (prefix / "build" / "bin" / "libllama.so").write_bytes(b"libllama")
    (prefix / ".configured").write_text(native.build_config("cpu", {}).stamp)
    cmake_files = prefix / "build" / "CMakeFiles" / "3.25.1"
    cmake_files.mkdir(parents=True)
    for lang in ("C", "CXX"):
        (cmake_files / f"CMake{lang}Compiler.cmake").write_text(
            f'set(CMAKE_{lang}_COMPILER "/usr/bin/cc")\n'
            f'set(CMAKE_{lang}_COMPILER_ID "GNU")\n'
            f'set(CMAKE_{lang}_COMPILER_VERSION "12.2.0")\n'
        )
    (prefix / native.CHECKED).write_text("passed\n")
    return prefix


@pytest.fixture
def ffi_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, Path]:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "cdef.h").write_text("int x;\n")
    (pkg / "shim.c").write_text("\n")
    monkeypatch.setattr(build_ffi, "ROOT", tmp_path)
    monkeypatch.setattr(build_ffi, "PKG", pkg)
    monkeypatch.setattr(build_ffi, "CDEF", pkg / "cdef.h")
    monkeypatch.setattr(build_ffi, "SHIM", pkg / "shim.c")
    monkeypatch.setattr(build_ffi.cffi, "FFI", FakeFFI)
    FakeFFI.compiles = []
    builds = {
        "cpu": _checked_build(tmp_path / "cache", "cpu"),
        "cuda": _checked_build(tmp_path / "cache", "cuda"),
    }
    monkeypatch.setattr(native, "build_prefix", lambda config: builds[config.backend])
    return builds


def _ext(pkg: Path) -> Path:
    return next(p for p in pkg.glob("_llama*") if not p.name.endswith(".json"))


def test_ffi_relinks_when_the_backend_and_its_library_folder_change(
    ffi_env: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLAMA_BACKEND", "cpu")
    build_ffi.main([])
    build_ffi.main([])
    assert FakeFFI.compiles == [str(ffi_env["cpu"] / "build" / "bin")]
    monkeypatch.setenv("LLAMA_BACKEND", "cuda")
    build_ffi.main([])
    cuda_libs = str(ffi_env["cuda"] / "build" / "bin")
    assert FakeFFI.compiles[-1] == cuda_libs
    ext = _ext(build_ffi.PKG)
    assert ext.read_text() == cuda_libs
    record = json.loads(ext.with_name(ext.name + build_ffi.STAMP_SUFFIX).read_text())
    assert record["backend"] == "cuda"
    assert record["lib_dir"] == cuda_libs


def test_ffi_records_what_the_libraries_were_built_from(
    ffi_env: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The build's cache identity (llamad.llama_ffi.build_info) reads these at run time.
    monkeypatch.setenv("LLAMA_BACKEND", "cpu")
    build_ffi.main([])
    ext = _ext(build_ffi.PKG)
    record = json.loads(ext.with_name(ext.name + build_ffi.STAMP_SUFFIX).read_text())
    assert record["configured"] == (ffi_env["cpu"] / ".configured").read_text()
    assert record["compilers"] == {"C": "GNU 12.2.0", "CXX": "GNU 12.2.0"}
    assert record["pin"]["llama_cpp_commit"] == build_ffi._pins.LLAMA_CPP_COMMIT
    # A reconfigured folder (another stamp) relinks, so the record never lags it.
    (ffi_env["cpu"] / ".configured").write_text("-DCMAKE_BUILD_TYPE=Debug\n")
    build_ffi.main([])
    assert len(FakeFFI.compiles) == 2


def test_ffi_refuses_a_build_folder_without_its_configuration(
    ffi_env: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLAMA_BACKEND", "cpu")
    (ffi_env["cpu"] / ".configured").unlink()
    with pytest.raises(native.BuildRefused, match="configuration"):
        build_ffi.main([])
    assert FakeFFI.compiles == []


def test_ffi_relinks_when_an_input_changes_even_if_older(
    ffi_env: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLAMA_BACKEND", "cpu")
    build_ffi.main([])
    cdef = build_ffi.CDEF
    mtime = cdef.stat().st_mtime
    cdef.write_text("int y;\n")
    os.utime(cdef, (mtime - 3600, mtime - 3600))  # older than the extension
    build_ffi.main([])
    assert len(FakeFFI.compiles) == 2


def test_ffi_refuses_a_build_that_has_not_passed_the_check(
    ffi_env: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLAMA_BACKEND", "cpu")
    (ffi_env["cpu"] / native.CHECKED).unlink()
    with pytest.raises(native.BuildRefused, match="has not passed its check"):
        build_ffi.main([])
    assert FakeFFI.compiles == []
