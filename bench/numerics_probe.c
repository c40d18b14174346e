/* A long-lived decode probe for bench/numerics_bench.py's paired decode step
 * (issue 16 item 1's bar: decode after patch 0003 >= 0.97x before).
 *
 *     numerics_probe MODEL N_CTX THREADS PREFILL SEED
 *
 * Compiled once per llama.cpp build, against that build's headers and linked
 * (rpath) to that build's libllama, so two of them running side by side are the
 * "before" and "after" builds with nothing else different. It loads the model,
 * makes one context the way llamad's worker does on the CPU (flash attention
 * on, f16 KV, n_batch 2048, n_ubatch 512, one sequence, no perf counters),
 * prefills PREFILL pseudo-random tokens (the same ones for the same SEED) and
 * prints "ready <prefill ms>". Then one command a line on stdin:
 *
 *   depth D    keep the first D cells of the prefill (llama_memory_seq_rm from
 *              D); D only goes down, so one prefill serves every depth.
 *              Answers "ok".
 *   burst N    greedy-decode N tokens at positions D..D+N-1 (the first input is
 *              a fixed token, each next one the previous step's argmax), one
 *              llama_decode per token as a decode step runs in the daemon, then
 *              remove the burst's cells again (seq_rm from D), so every burst
 *              runs at the same KV depth. Answers "<wall ms> <N token ids>":
 *              the tokens let the coordinator check that every repetition
 *              decodes the same (the cells really were removed).
 *   quit
 *
 * The wall time covers the N llama_decode calls and the argmax reads, taken
 * with CLOCK_MONOTONIC inside this process (no pipe or Python in it).
 */
#define _POSIX_C_SOURCE 200809L
#include "llama.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double) ts.tv_sec * 1e3 + (double) ts.tv_nsec / 1e6;
}

static void die(const char * what, int rc) {
    fprintf(stderr, "numerics_probe: %s (rc=%d)\n", what, rc);
    exit(2);
}

static void quiet_log(enum ggml_log_level level, const char * text, void * user) {
    (void) user;
    if (level == GGML_LOG_LEVEL_ERROR) fputs(text, stderr);
}

static llama_token argmax(const float * logits, int n_vocab) {
    int best = 0;
    for (int i = 1; i < n_vocab; i++)
        if (logits[i] > logits[best]) best = i;
    return (llama_token) best;
}

int main(int argc, char ** argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s MODEL N_CTX THREADS PREFILL SEED\n", argv[0]);
        return 1;
    }
    const char * model_path = argv[1];
    const int n_ctx = atoi(argv[2]);
    const int threads = atoi(argv[3]);
    const int prefill = atoi(argv[4]);
    unsigned long long seed = strtoull(argv[5], NULL, 10);
    if (n_ctx <= prefill || threads < 1 || prefill < 1) die("bad arguments", 0);

    llama_log_set(quiet_log, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    struct llama_model * model = llama_model_load_from_file(model_path, mp);
    if (!model) die("model load failed", 0);
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t) n_ctx;
    cp.n_batch = 2048;
    cp.n_ubatch = 512;
    cp.n_seq_max = 1;
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
    cp.type_k = GGML_TYPE_F16;
    cp.type_v = GGML_TYPE_F16;
    cp.kv_unified = false;
    cp.swa_full = true;
    cp.no_perf = true;
    struct llama_context * ctx = llama_init_from_model(model, cp);
    if (!ctx) die("context create failed", 0);
    llama_memory_t mem = llama_get_memory(ctx);

    /* The prompt: PREFILL tokens from a 64-bit LCG (the same on every build). */
    struct llama_batch b = llama_batch_init(2048, 0, 1);
    double t0 = now_ms();
    for (int start = 0; start < prefill; start += 2048) {
        int n = prefill - start < 2048 ? prefill - start : 2048;
        b.n_tokens = n;
        for (int i = 0; i < n; i++) {
            seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
            b.token[i] = (llama_token) ((seed >> 33) % (unsigned long long) n_vocab);
            b.pos[i] = start + i;
            b.n_seq_id[i] = 1;
            b.seq_id[i][0] = 0;
            b.logits[i] = 0;
        }
        int rc = llama_decode(ctx, b);
        if (rc != 0) die("prefill decode failed", rc);
    }
    printf("ready %.3f\n", now_ms() - t0);
    fflush(stdout);

    int depth = prefill;
    const llama_token first = (llama_token) (n_vocab / 3);
    char line[256];
    while (fgets(line, sizeof line, stdin)) {
        int arg = 0;
        if (strncmp(line, "quit", 4) == 0) break;
        if (sscanf(line, "depth %d", &arg) == 1) {
            if (arg < 1 || arg > depth) die("depth must go down", arg);
            if (!llama_memory_seq_rm(mem, 0, arg, -1)) die("seq_rm failed", arg);
            depth = arg;
            printf("ok\n");
        } else if (sscanf(line, "burst %d", &arg) == 1) {
            if (arg < 1 || depth + arg > n_ctx) die("burst does not fit", arg);
            llama_token tok = first;
            char out[64 * 1024];
            int used = 0;
            double start = now_ms();
            for (int i = 0; i < arg; i++) {
                b.n_tokens = 1;
                b.token[0] = tok;
                b.pos[0] = depth + i;
                b.n_seq_id[0] = 1;
                b.seq_id[0][0] = 0;
                b.logits[0] = 1;
                int rc = llama_decode(ctx, b);
                if (rc != 0) die("burst decode failed", rc);
                tok = argmax(llama_get_logits_ith(ctx, -1), n_vocab);
                if (used < (int) sizeof out - 16) used += snprintf(out + used, sizeof out - used, " %d", tok);
            }
            double ms = now_ms() - start;
            if (!llama_memory_seq_rm(mem, 0, depth, -1)) die("seq_rm failed", depth);
            printf("%.4f%s\n", ms, out);
        } else {
            die("unknown command", 0);
        }
        fflush(stdout);
    }
    llama_batch_free(b);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
