"""What a libllama build's cache identity is made of (SPEC C12).

``describe_build`` is fed stand-in build records and loaded-library facts, so
builds that cannot be made on this machine (CUDA, another pin, another
compiler) are compared here; the build actually loaded is read at the end.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from llamad import _pins
from llamad.llama_ffi import build_info, system_info
from llamad.llama_ffi.build_identity import (
    NEUTRAL_CMAKE,
    NEUTRAL_ENV,
    NEUTRAL_FEATURES,
    BuildIdentity,
    BuildRecordError,
    LoadedBuild,
    describe_build,
)
from llamad.llama_ffi.errors import LlamaError

pytestmark = pytest.mark.timeout(30)

FLAGS = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=ON",
    "-DGGML_NATIVE=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_CURL=OFF",
]
CPU_FEATURES = (("AVX", "1"), ("AVX2", "1"), ("FMA", "1"), ("OPENMP", "1"), ("REPACK", "1"))


def record(
    *,
    flags: list[str] | None = None,
    env: dict[str, str] | None = None,
    tree: str | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """A build record as build_ffi.py writes it, for a stamp made of ``flags`` and ``env``."""
    lines = [shlex.join(FLAGS if flags is None else flags)]
    lines += [f"{k}={v}" for k, v in sorted((env or {}).items())]
    if tree:
        lines.append(f"source-tree-sha256={tree}")
    return {
        "backend": "cpu",
        "lib_dir": "/home/alice/.cache/llamad/llama.cpp/0.3.36-0c1e570-cpu/build/bin",
        "sha256": {"libllama": "aa" * 32},
        "pin": {"llama_cpp_python": "0.3.36", "llama_cpp_commit": "0c1e570", "sdist_sha256": "x"},
        "configured": "\n".join(lines) + "\n",
        "compilers": {"C": "GNU 12.2.0", "CXX": "GNU 12.2.0"},
        **fields,
    }


def loaded(**changes: Any) -> LoadedBuild:
    base = LoadedBuild(
        ggml_version="0.25.3",
        ggml_commit="unknown",
        backends=("CPU",),
        devices=(("CPU", "cpu"),),
        features=(("CPU", CPU_FEATURES),),
    )
    return dataclasses.replace(base, **changes)


def identity(rec: dict[str, Any] | None = None, lib: LoadedBuild | None = None) -> BuildIdentity:
    return BuildIdentity.of(describe_build(rec or record(), lib or loaded()))


def cuda_build() -> BuildIdentity:
    return identity(
        record(backend="cuda", flags=[*FLAGS, "-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=90"]),
        loaded(
            backends=("CUDA", "CPU"),
            devices=(("CUDA", "gpu"), ("CPU", "cpu")),
            features=(("CUDA", (("ARCHS", "900"),)), ("CPU", CPU_FEATURES)),
        ),
    )


BASE = identity()

# Each differs from BASE in one thing that changes the saved state format or
# the numbers a kernel computes.
OTHER_BUILDS: dict[str, Callable[[], BuildIdentity]] = {
    "pin": lambda: identity(
        record(pin={"llama_cpp_python": "0.3.40", "llama_cpp_commit": "9f1e2d3"})
    ),
    "source_tree": lambda: identity(record(tree="ab" * 32)),
    "patches": lambda: identity(record(patches="cd" * 32)),
    "ggml_version": lambda: identity(lib=loaded(ggml_version="0.26.0")),
    "ggml_commit": lambda: identity(lib=loaded(ggml_commit="0c1e570-dirty")),
    "backend_cuda": cuda_build,
    "backend_vulkan_record": lambda: identity(record(backend="vulkan")),
    "gpu_build_without_its_gpu": lambda: identity(
        record(backend="cuda", flags=[*FLAGS, "-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=90"]),
        loaded(backends=("CUDA", "CPU"), features=(("CUDA", (("ARCHS", "900"),)),)),
    ),
    "build_type_debug": lambda: identity(
        record(flags=[f.replace("Release", "Debug") for f in FLAGS])
    ),
    "native_off": lambda: identity(
        record(flags=[f.replace("NATIVE=ON", "NATIVE=OFF") for f in FLAGS])
    ),
    "llamafile_off": lambda: identity(record(flags=[*FLAGS, "-DGGML_LLAMAFILE=OFF"])),
    "unknown_flag": lambda: identity(record(flags=[*FLAGS, "-DGGML_SOMETHING_NEW=ON"])),
    "cflags_fast_math": lambda: identity(record(env={"CFLAGS": "-ffast-math"})),
    "cxxflags": lambda: identity(record(env={"CXXFLAGS": "-O1"})),
    "ldflags": lambda: identity(record(env={"LDFLAGS": "-ffast-math"})),
    "compiler_version": lambda: identity(
        record(compilers={"C": "GNU 13.2.0", "CXX": "GNU 13.2.0"})
    ),
    "compiler_clang": lambda: identity(
        record(compilers={"C": "Clang 17.0.6", "CXX": "Clang 17.0.6"})
    ),
    "cpu_feature_avx512": lambda: identity(
        lib=loaded(features=(("CPU", (*CPU_FEATURES, ("AVX512", "1"))),))
    ),
    "untiled_flash_attention": lambda: identity(
        lib=loaded(switches=build_info.numeric_switches({"GGML_CPU_FA_TILED": "0"}))
    ),
    "untiled_kquant_matmul": lambda: identity(
        lib=loaded(switches=build_info.numeric_switches({"GGML_CPU_TILED_MM": "0"}))
    ),
    "cpu_feature_repack_off": lambda: identity(
        lib=loaded(
            features=(("CPU", tuple((n, "0" if n == "REPACK" else v) for n, v in CPU_FEATURES)),)
        )
    ),
}

# Each differs from BASE only in something that cannot change a kernel, a
# result or the state format, so it must not split the cache.
SAME_BUILDS: dict[str, Callable[[], BuildIdentity]] = {
    "library_folder_and_digests": lambda: identity(
        record(lib_dir="/srv/llamad/cache/llama.cpp/build/lib", sha256={"libllama": "bb" * 32})
    ),
    "tests_and_tools_built": lambda: identity(
        record(flags=[*FLAGS, "-DLLAMA_BUILD_TESTS=ON", "-DLLAMA_BUILD_APP=ON"])
    ),
    "openmp_off": lambda: identity(
        record(flags=[*FLAGS, "-DGGML_OPENMP=OFF"]),
        loaded(
            features=(("CPU", tuple((n, "0" if n == "OPENMP" else v) for n, v in CPU_FEATURES)),)
        ),
    ),
    "generator": lambda: identity(
        record(flags=["-G", "Ninja", *FLAGS], env={"CMAKE_GENERATOR": "Ninja"})
    ),
    "compiler_paths": lambda: identity(
        record(
            env={"CC": "/usr/bin/gcc", "CXX": "/usr/bin/g++"},
            flags=[*FLAGS, "-DCMAKE_C_COMPILER=/usr/bin/gcc"],
        )
    ),
    "install_prefix_and_launcher": lambda: identity(
        record(flags=[*FLAGS, "-DCMAKE_INSTALL_PREFIX=/opt/x", "-DGGML_CCACHE=OFF"])
    ),
    "flag_spelling": lambda: identity(
        record(flags=[f.replace("GGML_NATIVE=ON", "GGML_NATIVE:BOOL=on") for f in FLAGS])
    ),
    "flag_order": lambda: identity(record(flags=list(reversed(FLAGS)))),
    "a_flag_given_twice_last_wins": lambda: identity(
        record(flags=[*FLAGS, "-DCMAKE_BUILD_TYPE=Debug", "-DCMAKE_BUILD_TYPE=Release"])
    ),
    "device_count": lambda: identity(lib=loaded(devices=(("CPU", "cpu"), ("CPU", "cpu")))),
    "tiled_flash_attention_said_explicitly": lambda: identity(
        lib=loaded(switches=build_info.numeric_switches({"GGML_CPU_FA_TILED": "1"}))
    ),
    "registration_order": lambda: identity(
        lib=loaded(features=(("CPU", tuple(reversed(CPU_FEATURES))),))
    ),
}


@pytest.mark.parametrize("name", sorted(OTHER_BUILDS))
def test_a_build_that_computes_or_saves_differently_has_another_identity(name: str) -> None:
    other = OTHER_BUILDS[name]()
    assert other.digest != BASE.digest, other.as_dict()


def test_every_other_build_is_distinct_from_every_other() -> None:
    digests = {name: make().digest for name, make in OTHER_BUILDS.items()}
    assert len(set(digests.values())) == len(digests)


@pytest.mark.parametrize("name", sorted(SAME_BUILDS))
def test_what_cannot_change_the_numbers_keeps_the_identity(name: str) -> None:
    same = SAME_BUILDS[name]()
    assert same == BASE, (same.as_dict(), BASE.as_dict())


def test_nothing_path_or_host_dependent_is_in_the_identity() -> None:
    text = json.dumps(cuda_build().as_dict()) + json.dumps(BASE.as_dict())
    assert "/" not in text
    assert "alice" not in text


def test_every_neutral_setting_has_a_reason() -> None:
    for table in (NEUTRAL_CMAKE, NEUTRAL_ENV, NEUTRAL_FEATURES):
        assert table and all(reason.strip() for reason in table.values())
    # The settings that select a build's numerics are never neutral.
    numerics = {"CMAKE_BUILD_TYPE", "GGML_NATIVE", "GGML_CUDA", "CMAKE_CUDA_ARCHITECTURES"}
    assert not numerics & set(NEUTRAL_CMAKE)
    assert not {"CFLAGS", "CXXFLAGS", "CUDAFLAGS", "LDFLAGS", "CUDAARCHS"} & set(NEUTRAL_ENV)


def test_the_digest_is_over_sorted_components_under_a_domain() -> None:
    a = BuildIdentity.of({"x": "1", "y": "2"})
    assert a == BuildIdentity.of({"y": "2", "x": "1"})
    assert a.components == (("x", "1"), ("y", "2"))
    assert a.hex == a.digest.hex() and len(a.digest) == 32
    assert a.with_components(x="3") != a
    for bad in ({"": "v"}, {"a=b": "v"}, {"a\0": "v"}):
        with pytest.raises(ValueError):
            BuildIdentity.of(bad)
    # A value holding a separator could pass for two components.
    with pytest.raises(ValueError):
        BuildIdentity.of({"x": "1\0y=2"})


@pytest.mark.parametrize("missing", ["pin", "configured", "compilers", "backend"])
def test_a_record_from_an_older_build_ffi_is_refused(missing: str) -> None:
    rec = record()
    del rec[missing]
    with pytest.raises(BuildRecordError, match=missing):
        describe_build(rec, loaded())


# -- the build loaded in this process ----------------------------------------------------


def test_the_loaded_build_is_described_from_the_record_and_the_libraries() -> None:
    ident = build_info.build_identity()
    assert ident is build_info.build_identity()  # once per process
    parts = ident.as_dict()
    assert parts["pin"] == (
        f"llama.cpp {_pins.LLAMA_CPP_COMMIT} (llama-cpp-python {_pins.LLAMA_CPP_PYTHON_VERSION})"
    )
    rec = build_info.build_record()
    assert parts["backend"] == rec["backend"]
    assert "CMAKE_BUILD_TYPE=Release" in parts["cmake"].split()
    assert "CPU" in parts["ggml.backends"].split(",")
    assert "CPU:cpu" in parts["ggml.devices"].split(",")
    if rec["backend"] == "cpu":
        assert parts["ggml.devices"] == "CPU:cpu"


def test_the_features_read_are_the_ones_llama_prints() -> None:
    lib = build_info.loaded_build()
    printed = {
        item.split("=")[0].strip().rsplit(" ", 1)[-1]: item.split("=")[1].strip()
        for item in system_info().split("|")
        if "=" in item
    }
    read = {name: value for _, feats in lib.features for name, value in feats}
    assert read == printed
    assert lib.ggml_version.count(".") == 2


def test_the_identity_is_logged_once_when_first_computed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build_info, "_identity", None)
    with capture_logs() as logs:
        first = build_info.build_identity()
        assert build_info.build_identity() is first
    events = [e for e in logs if e["event"] == "llama.build_identity"]
    assert len(events) == 1
    assert events[0]["build"] == first.hex
    assert events[0]["components"] == first.as_dict()


def test_a_stale_build_record_is_a_typed_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(build_info, "_identity", None)
    monkeypatch.setattr(build_info, "build_record", lambda: {"backend": "cpu"})
    with pytest.raises(LlamaError, match=r"rebuild with build_ffi\.py"):
        build_info.build_identity()


def test_the_record_names_what_the_libraries_were_built_from() -> None:
    rec = build_info.build_record()
    assert rec["pin"]["llama_cpp_commit"] == _pins.LLAMA_CPP_COMMIT
    assert rec["patches"] == _pins.LLAMA_CPP_PATCHES_SHA256
    prefix = Path(rec["lib_dir"])
    while not (prefix / ".configured").is_file():
        assert prefix != prefix.parent, "no .configured stamp above the library folder"
        prefix = prefix.parent
    assert rec["configured"] == (prefix / ".configured").read_text()
    assert rec["compilers"].get("C")


@pytest.mark.parametrize(
    ("value", "off"),
    [
        ("0", True),
        ("00", True),
        (" 0", True),
        ("no", True),
        ("", True),
        ("1", False),
        ("2", False),
        ("-1", False),
        (" 7x", False),
    ],
)
def test_the_tiled_switch_is_read_as_ggml_reads_it(value: str, off: bool) -> None:
    # ggml-cpu parses it with atoi: anything that is not a non-zero number turns it off.
    got = build_info.numeric_switches({"GGML_CPU_FA_TILED": value})
    assert got == ((("GGML_CPU_FA_TILED", "0"),) if off else ())
    assert build_info.numeric_switches({}) == ()
