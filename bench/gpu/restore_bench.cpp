// GPU warm-path probe for SPEC issue 21, item 5 (see bench/gpu/README.md).
//
// Measures, on one CUDA device at the pinned llama.cpp, for rows of N tokens:
//   cold   prefill N-1 tokens + one 1-token decode (what a miss costs),
//   warm   llama_state_seq_set_data of the N-1 row + the same 1-token decode
//          (what an exact hit costs: one restore and one sample),
// for the host buffer kinds a daemon could restore from (pageable malloc,
// cudaHostAlloc pinned, malloc + cudaHostRegister, and the ON_DEVICE flag),
// and the floors: cudaMemcpy of the row's bytes from pinned and from pageable
// memory. Each warm run checks the 1-token decode's logits against the cold
// run's, bit for bit, and one run per kind overwrites the source buffer the
// moment set_data returns (llama.cpp #26828: a deferred copy would then read
// garbage), so "kept alive until the copy completes" is measured, not assumed.
//
// Built without CUDA (no -DWITH_CUDA) it runs the same steps on the CPU with
// the pinned kinds left out: that is how it is checked on a machine with no GPU.
#include "llama.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#ifdef WITH_CUDA
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { \
    std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_)); std::exit(3); } } while (0)
#endif

using clk = std::chrono::steady_clock;
static double ms_since(clk::time_point t0) {
    return std::chrono::duration<double, std::milli>(clk::now() - t0).count();
}

static FILE * out = stdout;

struct stats { double min = 0, med = 0, max = 0; };
static stats summarize(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    stats s; s.min = v.front(); s.max = v.back(); s.med = v[v.size() / 2];
    return s;
}
static void emit(const char * what, int n, size_t bytes, const std::vector<double> & ms, const char * extra = "") {
    stats s = summarize(ms);
    double gbs = bytes ? (double) bytes / (s.med * 1e-3) / 1e9 : 0.0;
    std::fprintf(out, "{\"what\": \"%s\", \"tokens\": %d, \"bytes\": %zu, \"reps\": %zu, "
                      "\"ms_min\": %.4f, \"ms_median\": %.4f, \"ms_max\": %.4f, \"gb_per_s_median\": %.3f%s}\n",
                 what, n, bytes, ms.size(), s.min, s.med, s.max, gbs, extra);
    std::fflush(out);
}

static void decode_or_die(llama_context * ctx, llama_batch & b) {
    int rc = llama_decode(ctx, b);
    if (rc != 0) { std::fprintf(stderr, "llama_decode rc=%d\n", rc); std::exit(2); }
}

// Prefill toks[0..n) into seq 0 in chunks of n_batch, no logits.
static void prefill(llama_context * ctx, const std::vector<llama_token> & toks, int n, int n_batch) {
    llama_batch b = llama_batch_init(n_batch, 0, 1);
    for (int i = 0; i < n; i += n_batch) {
        int m = std::min(n_batch, n - i);
        b.n_tokens = m;
        for (int j = 0; j < m; j++) {
            b.token[j] = toks[i + j]; b.pos[j] = i + j; b.n_seq_id[j] = 1; b.seq_id[j][0] = 0; b.logits[j] = 0;
        }
        decode_or_die(ctx, b);
    }
    llama_batch_free(b);
}

// One 1-token decode of `tok` at `pos` in seq 0; returns its logits.
static std::vector<float> step(llama_context * ctx, llama_token tok, int pos, int n_vocab) {
    llama_batch b = llama_batch_init(1, 0, 1);
    b.n_tokens = 1; b.token[0] = tok; b.pos[0] = pos; b.n_seq_id[0] = 1; b.seq_id[0][0] = 0; b.logits[0] = 1;
    decode_or_die(ctx, b);
    const float * l = llama_get_logits_ith(ctx, 0);
    std::vector<float> v(l, l + n_vocab);
    llama_batch_free(b);
    return v;
}

static double max_abs_diff(const std::vector<float> & a, const std::vector<float> & b) {
    double d = 0; for (size_t i = 0; i < a.size(); i++) d = std::max(d, (double) std::fabs(a[i] - b[i]));
    return d;
}

int main(int argc, char ** argv) {
    if (argc < 4) { std::fprintf(stderr, "usage: %s MODEL.gguf REPS N [N...]\n", argv[0]); return 1; }
    const char * model_path = argv[1];
    const int reps = std::atoi(argv[2]);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 999;
    llama_model * model = llama_model_load_from_file(model_path, mp);
    if (!model) { std::fprintf(stderr, "model load failed\n"); return 2; }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

    for (int ai = 3; ai < argc; ai++) {
        const int n = std::atoi(argv[ai]);
        llama_context_params cp = llama_context_default_params();
        cp.n_ctx = (uint32_t) (n + 256);
        cp.n_batch = 2048; cp.n_ubatch = 512; cp.n_seq_max = 1;
        const char * th = std::getenv("BENCH_THREADS");
        cp.n_threads = cp.n_threads_batch = th ? std::atoi(th) : 4;
        cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
        cp.no_perf = true;
        llama_context * ctx = llama_init_from_model(model, cp);
        if (!ctx) { std::fprintf(stderr, "context for %d tokens failed\n", n); return 2; }
        llama_memory_t mem = llama_get_memory(ctx);

        std::mt19937 rng(1234 + n);
        std::vector<llama_token> toks(n);
        for (auto & t : toks) t = (llama_token) (rng() % (unsigned) n_vocab);

        // Cold: prefill the row (N-1 tokens), then the one sample. First run warms kernels.
        std::vector<double> cold, cold_prefill;
        std::vector<float> ref;
        for (int r = 0; r < std::max(2, reps / 2) + 1; r++) {
            llama_memory_seq_rm(mem, 0, -1, -1);
            llama_synchronize(ctx);
            auto t0 = clk::now();
            prefill(ctx, toks, n - 1, (int) cp.n_batch);
            llama_synchronize(ctx);
            double tp = ms_since(t0);
            std::vector<float> l = step(ctx, toks[n - 1], n - 1, n_vocab);
            double tc = ms_since(t0);
            if (r == 0) { ref = l; continue; }
            if (max_abs_diff(l, ref) != 0.0) std::fprintf(out, "{\"note\": \"cold runs differ\", \"tokens\": %d, \"max_abs\": %g}\n", n, max_abs_diff(l, ref));
            cold.push_back(tc); cold_prefill.push_back(tp);
        }
        emit("cold_prefill_plus_sample", n, 0, cold);
        emit("cold_prefill_only", n, 0, cold_prefill);

        // The row: state of the N-1 tokens, saved to a pageable buffer.
        llama_memory_seq_rm(mem, 0, -1, -1);
        prefill(ctx, toks, n - 1, (int) cp.n_batch);
        llama_synchronize(ctx);
        const size_t size = llama_state_seq_get_size(ctx, 0);
        std::vector<uint8_t> row(size);
        std::vector<double> save;
        for (int r = 0; r < reps; r++) {
            auto t0 = clk::now();
            size_t got = llama_state_seq_get_data(ctx, row.data(), size, 0);
            save.push_back(ms_since(t0));
            if (got != size) { std::fprintf(stderr, "get_data %zu != %zu\n", got, size); return 2; }
        }
        emit("save_get_data_pageable", n, size, save);

        struct kind { const char * name; uint8_t * buf; llama_state_seq_flags flags; };
        std::vector<kind> kinds;
        kinds.push_back({"pageable_malloc", row.data(), 0});
#ifdef WITH_CUDA
        uint8_t * pinned = nullptr; CK(cudaHostAlloc((void **) &pinned, size, cudaHostAllocDefault));
        std::memcpy(pinned, row.data(), size);
        kinds.push_back({"pinned_cudaHostAlloc", pinned, 0});
        uint8_t * reg = (uint8_t *) std::aligned_alloc(4096, (size + 4095) / 4096 * 4096);
        std::memcpy(reg, row.data(), size);
        CK(cudaHostRegister(reg, size, cudaHostRegisterDefault));
        kinds.push_back({"registered_malloc", reg, 0});
#endif
        // What llamad's ram_file tier holds: the row in a /dev/shm file, mapped.
        std::string shm_path = "/dev/shm/restore-bench-" + std::to_string(getpid()) + "-" + std::to_string(n);
        int fd = open(shm_path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
        if (fd < 0 || ftruncate(fd, (off_t) size) != 0) { std::fprintf(stderr, "shm file failed\n"); return 2; }
        uint8_t * shm = (uint8_t *) mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (shm == MAP_FAILED) { std::fprintf(stderr, "mmap failed\n"); return 2; }
        std::memcpy(shm, row.data(), size);
        kinds.push_back({"shm_mmap", shm, 0});
#ifdef WITH_CUDA
        kinds.push_back({"shm_mmap_registered", shm, 0});  // registered just before its turn
#endif
        for (const kind & k : kinds) {
#ifdef WITH_CUDA
            if (std::strcmp(k.name, "shm_mmap_registered") == 0) {
                // Registering is a one-off cost per mapping: measured, since a
                // daemon would pay it per row (or once per arena) before it helps.
                auto t0 = clk::now();
                cudaError_t e = cudaHostRegister(shm, size, cudaHostRegisterDefault);
                double treg = ms_since(t0);
                std::fprintf(out, "{\"what\": \"cudaHostRegister_shm\", \"tokens\": %d, \"bytes\": %zu, \"ms\": %.4f, \"ok\": %s}\n",
                             n, size, treg, e == cudaSuccess ? "true" : "false");
                if (e != cudaSuccess) { cudaGetLastError(); continue; }
            }
#endif
            std::vector<double> set, ttft;
            double worst = 0;
            for (int r = 0; r < reps + 1; r++) {
                llama_memory_seq_rm(mem, 0, -1, -1);
                llama_synchronize(ctx);
                auto t0 = clk::now();
                size_t rc = llama_state_seq_set_data_ext(ctx, k.buf, size, 0, k.flags);
                double ts = ms_since(t0);
                if (rc == 0) { std::fprintf(stderr, "set_data failed (%s)\n", k.name); return 2; }
                std::vector<float> l = step(ctx, toks[n - 1], n - 1, n_vocab);
                double tt = ms_since(t0);
                worst = std::max(worst, max_abs_diff(l, ref));
                if (r > 0) { set.push_back(ts); ttft.push_back(tt); }
            }
            char extra[128];
            std::snprintf(extra, sizeof extra, ", \"kind\": \"%s\", \"max_abs_vs_cold\": %g", k.name, worst);
            emit("warm_set_data", n, size, set, extra);
            emit("warm_restore_plus_sample", n, size, ttft, extra);

            // Lifetime: scribble over the source the moment set_data returns.
            std::vector<uint8_t> keep(k.buf, k.buf + size);
            llama_memory_seq_rm(mem, 0, -1, -1);
            llama_synchronize(ctx);
            llama_state_seq_set_data_ext(ctx, k.buf, size, 0, k.flags);
            std::memset(k.buf, 0xA5, size);
            std::vector<float> l = step(ctx, toks[n - 1], n - 1, n_vocab);
            std::memcpy(k.buf, keep.data(), size);
            std::fprintf(out, "{\"what\": \"source_overwritten_after_set_data\", \"tokens\": %d, \"kind\": \"%s\", \"max_abs_vs_cold\": %g}\n",
                         n, k.name, max_abs_diff(l, ref));
        }

        // ON_DEVICE: the state stays in device buffers (no host copy at all).
        {
            const llama_state_seq_flags F = LLAMA_STATE_SEQ_FLAGS_ON_DEVICE;
            llama_memory_seq_rm(mem, 0, -1, -1);
            prefill(ctx, toks, n - 1, (int) cp.n_batch);
            llama_synchronize(ctx);
            size_t dsize = llama_state_seq_get_size_ext(ctx, 0, F);
            std::vector<uint8_t> dbuf(dsize);
            auto t0 = clk::now();
            size_t got = llama_state_seq_get_data_ext(ctx, dbuf.data(), dsize, 0, F);
            double tsave = ms_since(t0);
            std::vector<double> set, ttft;
            double worst = 0;
            bool ok = got == dsize;
            for (int r = 0; ok && r < reps + 1; r++) {
                llama_memory_seq_rm(mem, 0, -1, -1);
                llama_synchronize(ctx);
                auto t1 = clk::now();
                size_t rc = llama_state_seq_set_data_ext(ctx, dbuf.data(), dsize, 0, F);
                double ts = ms_since(t1);
                if (rc == 0) { ok = false; break; }
                std::vector<float> l = step(ctx, toks[n - 1], n - 1, n_vocab);
                double tt = ms_since(t1);
                worst = std::max(worst, max_abs_diff(l, ref));
                if (r > 0) { set.push_back(ts); ttft.push_back(tt); }
            }
            if (ok && !set.empty()) {
                char extra[160];
                std::snprintf(extra, sizeof extra, ", \"kind\": \"on_device\", \"host_bytes\": %zu, \"save_ms\": %.4f, \"max_abs_vs_cold\": %g", dsize, tsave, worst);
                emit("warm_set_data", n, size, set, extra);
                emit("warm_restore_plus_sample", n, size, ttft, extra);
            } else {
                std::fprintf(out, "{\"what\": \"on_device_failed\", \"tokens\": %d, \"size\": %zu, \"got\": %zu}\n", n, dsize, got);
            }
        }

#ifdef WITH_CUDA
        // Floors: the row's bytes copied once to the device.
        void * dev = nullptr; CK(cudaMalloc(&dev, size));
        struct src { const char * name; const void * p; };
        for (src s : {src{"memcpy_h2d_pinned", pinned}, src{"memcpy_h2d_registered", reg}, src{"memcpy_h2d_pageable", row.data()}}) {
            std::vector<double> v;
            for (int r = 0; r < reps + 1; r++) {
                CK(cudaDeviceSynchronize());
                auto t0 = clk::now();
                CK(cudaMemcpy(dev, s.p, size, cudaMemcpyHostToDevice));
                double t = ms_since(t0);
                if (r > 0) v.push_back(t);
            }
            emit(s.name, n, size, v);
        }
        CK(cudaFree(dev));
        cudaHostUnregister(shm); cudaGetLastError();
        CK(cudaHostUnregister(reg)); std::free(reg);
        CK(cudaFreeHost(pinned));
#endif
        munmap(shm, size); close(fd); unlink(shm_path.c_str());
        llama_free(ctx);
    }
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
