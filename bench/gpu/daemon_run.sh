#!/usr/bin/env bash
# One device call (bench/gpu/README.md, "The daemon on the GPU"): build the
# pinned, patched llama.cpp with CUDA the way `make setup` does
# (LLAMA_BACKEND=cuda scripts/native.py llama, then build_ffi.py), install
# llamad's Python dependencies from the wheels carried in .gpu/wheels, write
# the random-weight stand-in model, and run bench.gpu_daemon: the real daemon,
# every layer on the GPU, warm TTFT through the client. Results land in $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
W=/tmp/llamad-gpud; rm -rf "$W"; mkdir -p "$W"
phase() { echo "$(date +%s.%N | cut -c1-14) $*" >> "$OUT/phases.txt"; }
phase start
export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++ CMAKE_GENERATOR=Ninja CUDAARCHS=90
export LLAMA_BACKEND=cuda LLAMAD_CACHE_DIR="$W/cache" LLAMAD_DEFAULT_MODEL="$W/model.gguf"
# Only the libraries: the carried source leaves out tools/ and common/.
export CMAKE_ARGS="-DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_COMMON=OFF"
export PATH="$PATH:/usr/local/cuda/bin"
PY=python3
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; nvcc --version | tail -2; nproc; } > "$OUT/machine.txt" 2>&1
$PY -m pip install -q --no-index --find-links .gpu/wheels --target "$W/site" cffi pyzmq msgspec \
  structlog jinja2 crc32c msgpack psutil starlette==1.10.0 uvicorn==0.54.0 httptools==0.9.0 \
  > "$W/pip.log" 2>&1 || { tail -30 "$W/pip.log" > "$OUT/pip.log"; exit 9; }
export PYTHONPATH="$PWD/src:$PWD:$W/site"
phase installed
P=$($PY scripts/native.py prefix) || exit 10
mkdir -p "$P/src" && tar -C "$P/src" -xJf .gpu/llama-src.tar.xz || exit 10
# The carried tree is already patched (it was taken from a patched build folder).
(cd scripts && $PY -c "import native; print(native.patches_digest())") > "$P/src/.llamad-patches" || exit 10
phase extracted
( PYTHONPATH="$P/src/gguf-py" $PY bench/gpu/synth_model.py build .gpu "$W/model.gguf" > "$W/synth.log" 2>&1; echo "synth rc=$?" >> "$W/synth.log" ) &
SYNTH=$!
$PY scripts/native.py llama > "$W/native.log" 2>&1 || { wait "$SYNTH"; tail -60 "$W/native.log" > "$OUT/native.log"; tail -5 "$W/synth.log" >> "$OUT/native.log"; exit 11; }
phase built
wait "$SYNTH"; tail -3 "$W/synth.log" >> "$OUT/phases.txt"
$PY build_ffi.py > "$OUT/ffi.log" 2>&1 || exit 12
phase ffi
timeout 300 $PY -m bench.gpu_daemon "$W/model.gguf" "$OUT/machine.txt" ${GPU_DAEMON_ARGS:-} \
  --results "$OUT" --commit "${LLAMAD_COMMIT:-unknown}" > "$OUT/probe.txt" 2> "$W/probe.err"
rc=$?; phase "probe rc=$rc"
tail -60 "$W/probe.err" > "$OUT/probe_err_tail.txt"
for f in /tmp/llamad-peers-gpu-*/*.log; do [ -f "$f" ] && tail -80 "$f" > "$OUT/daemon_log_tail.txt"; done
exit $rc
