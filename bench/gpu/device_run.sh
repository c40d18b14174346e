#!/usr/bin/env bash
# One device call (bench/gpu/README.md): build the pinned, patched llama.cpp
# with CUDA, write the random-weight stand-in model, run restore_bench on rows
# of 2,048 and 16,384 tokens. Inputs travel in .gpu/ (made by prepare.sh);
# results land in $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
W=/tmp/llamad-gpu; rm -rf "$W"; mkdir -p "$W"
export CC=/usr/bin/gcc CXX=/usr/bin/g++ CUDAHOSTCXX=/usr/bin/g++
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
phase() { echo "$(date +%s.%N | cut -c1-14) $*" >> "$OUT/phases.txt"; }
phase start
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; nvcc --version | tail -2; nproc; } > "$OUT/machine.txt" 2>&1
tar -C "$W" -xJf .gpu/llama-src.tar.xz || exit 10
phase extracted
( PYTHONPATH="$W/gguf-py" python3 bench/gpu/synth_model.py build .gpu "$W/model.gguf" > "$W/synth.log" 2>&1; echo "synth rc=$?" >> "$W/synth.log" ) &
SYNTH=$!
cmake -S "$W" -B "$W/b" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_CUDA_COMPILER="$NVCC" \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
  -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_APP=OFF > "$W/build.log" 2>&1 || { tail -60 "$W/build.log" > "$OUT/build.log"; exit 11; }
phase configured
cmake --build "$W/b" --target llama -j 16 >> "$W/build.log" 2>&1 || { tail -80 "$W/build.log" > "$OUT/build.log"; exit 12; }
phase built
tail -15 "$W/build.log" > "$OUT/build.log"
"$NVCC" -O2 -std=c++17 -ccbin /usr/bin/g++ -DWITH_CUDA -I"$W/include" -I"$W/ggml/include" bench/gpu/restore_bench.cpp \
  -L"$W/b/bin" -lllama -Xlinker -rpath,"$W/b/bin" -o "$W/restore_bench" >> "$OUT/build.log" 2>&1 || exit 13
wait "$SYNTH"; phase synth_done
tail -3 "$W/synth.log" >> "$OUT/phases.txt"; ls -la "$W/model.gguf" >> "$OUT/phases.txt" 2>&1
timeout 200 "$W/restore_bench" "$W/model.gguf" 10 2048 8192 16384 > "$OUT/restore.jsonl" 2> "$W/restore.err"
rc=$?; phase "bench rc=$rc"
grep -v "state_read_meta\|state_write" "$W/restore.err" | tail -120 > "$OUT/restore_err_tail.txt"
[ $rc -eq 0 ] || exit $rc
# The result file is written here, by the script, from what was just measured.
python3 -m bench.gpu_restore "$OUT/restore.jsonl" "$OUT/machine.txt" --results "$OUT" --commit "${LLAMAD_COMMIT:-unknown}" > /dev/null
