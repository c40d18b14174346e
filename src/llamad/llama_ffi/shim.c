
/* llamad shim: small C helpers compiled into llamad.llama_ffi._llama.
 *
 * They exist for three reasons: loops over every token of a batch are far too
 * slow through cffi one field at a time, llama.cpp logs from its own threads
 * at a rate where calling into Python for messages we drop anyway would cost
 * real time, and ggml hands a backend's build features out only through a
 * function pointer looked up by name, which C calls with its type checked.
 */

#include <stdint.h>
#include <stddef.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

static void _llamad_log_cb(enum ggml_log_level level, const char * text, void * user_data);

/* Messages below this level never reach Python. GGML_LOG_LEVEL_CONT (5) and
 * above means "silent": nothing reaches Python at all, which is also the state
 * installed at interpreter exit so that a late log line from a C++ destructor
 * cannot call into a finalised interpreter. */
static volatile int llamad_log_min = GGML_LOG_LEVEL_WARN;
/* Level of the last message, so that a CONT fragment inherits it. A race
 * between threads only mislabels a continuation fragment. */
static volatile int llamad_log_last = GGML_LOG_LEVEL_INFO;

static void llamad_log_filter(enum ggml_log_level level, const char * text, void * user_data) {
    int effective = (int) level;
    if (level == GGML_LOG_LEVEL_CONT) {
        effective = llamad_log_last;
    } else {
        llamad_log_last = (int) level;
    }
    if (effective < llamad_log_min || llamad_log_min >= GGML_LOG_LEVEL_CONT) {
        return;
    }
    _llamad_log_cb((enum ggml_log_level) effective, text, user_data);
}

static void llamad_log_silent(enum ggml_log_level level, const char * text, void * user_data) {
    (void) level;
    (void) text;
    (void) user_data;
}

void llamad_log_install(int min_level) {
    llamad_log_min = min_level;
    if (min_level >= GGML_LOG_LEVEL_CONT) {
        llama_log_set(llamad_log_silent, NULL);
    } else {
        llama_log_set(llamad_log_filter, NULL);
    }
}

/* Append one run of consecutive positions of a single sequence. Returns the
 * index of the first appended row, or -1 when the batch would overflow
 * `capacity` (the batch is then left unchanged). */
int32_t llamad_batch_add_seq(struct llama_batch * batch, int32_t capacity, const llama_token * tokens,
                             int32_t n_tokens, llama_pos pos0, llama_seq_id seq_id, int8_t logits_last) {
    int32_t start = batch->n_tokens;
    if (n_tokens < 0 || start < 0 || n_tokens > capacity - start) {
        return -1;
    }
    for (int32_t i = 0; i < n_tokens; i++) {
        int32_t row = start + i;
        batch->token[row] = tokens[i];
        batch->pos[row] = pos0 + i;
        batch->n_seq_id[row] = 1;
        batch->seq_id[row][0] = seq_id;
        batch->logits[row] = 0;
    }
    if (n_tokens > 0 && logits_last) {
        batch->logits[start + n_tokens - 1] = 1;
    }
    batch->n_tokens = start + n_tokens;
    return start;
}

/* Validate every row against the context before llama.cpp sees the batch,
 * because several bad inputs trip GGML_ASSERT (an abort) instead of an error
 * return. Returns 0 when valid, else 1 = token id out of range, 2 = sequence
 * id out of range, 3 = position outside [0, n_ctx_seq); *bad_row names the
 * first offending row. */
int32_t llamad_batch_check(const struct llama_batch * batch, int32_t n_vocab, int32_t n_seq_max,
                           llama_pos n_ctx_seq, int32_t * bad_row) {
    for (int32_t i = 0; i < batch->n_tokens; i++) {
        *bad_row = i;
        llama_token t = batch->token[i];
        if (t < 0 || t >= n_vocab) {
            return 1;
        }
        for (int32_t s = 0; s < batch->n_seq_id[i]; s++) {
            llama_seq_id id = batch->seq_id[i][s];
            if (id < 0 || id >= n_seq_max) {
                return 2;
            }
        }
        if (batch->pos[i] < 0 || batch->pos[i] >= n_ctx_seq) {
            return 3;
        }
    }
    *bad_row = -1;
    return 0;
}

/* Index of the first token outside [0, n_vocab), or -1 when all are valid. */
int32_t llamad_tokens_check(const llama_token * tokens, int32_t n_tokens, int32_t n_vocab) {
    for (int32_t i = 0; i < n_tokens; i++) {
        if (tokens[i] < 0 || tokens[i] >= n_vocab) {
            return i;
        }
    }
    return -1;
}

/* Touch one byte per page, writing back what was read, so every page of the
 * buffer is mapped writable before a state copy lands in it; contents are
 * preserved. First, one madvise(MADV_POPULATE_WRITE) (Linux 5.14) faults the
 * whole range in at once: 60 MB of fresh anonymous memory took ~20 ms that
 * way against ~34 ms page by page (measured). Unlike mmap's MAP_POPULATE,
 * which CPython calls holding the GIL, this runs in a cffi call that
 * releases it. Where madvise refuses (an older kernel, memory it does not
 * manage) the loop does all the work, as before. */
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

void llamad_prefault(uint8_t * data, size_t size, size_t page) {
    volatile uint8_t * p = data;
    if (page == 0) {
        page = 4096;
    }
    if (size > 0) {
        uintptr_t start = (uintptr_t) data & ~((uintptr_t) page - 1);
        (void) madvise((void *) start, size + ((uintptr_t) data - start), MADV_POPULATE_WRITE);
    }
    for (size_t off = 0; off < size; off += page) {
        p[off] = p[off];
    }
    if (size > 0) {
        p[size - 1] = p[size - 1];
    }
}

/* Accept and return a picked token, or 2 for a NaN or -inf pick (the chain
 * ruled out every candidate), before anything is accepted. */
static int32_t llamad_pick(struct llama_sampler * chain, float logit, llama_token id,
                           llama_token * out) {
    if (isnan(logit) || (isinf(logit) && logit < 0)) {
        return 2;
    }
    llama_sampler_accept(chain, id);
    *out = id;
    return 0;
}

/* llama.cpp's greedy pick on a raw row: the first largest logit. A NaN never
 * compares larger, so it is never picked, unless it is entry 0, which the
 * greedy sampler starts from and then keeps (refused by llamad_pick). The
 * largest value is found first, then the first entry equal to it (of either
 * sign for a zero: the first of them, as the sampler keeps it). With SSE
 * both passes take four entries at a time: _mm_max_ps(l, m) is l > m ? l : m
 * (a NaN l yields m), the scalar loops' own rule; scalar, the 49,152-entry
 * row of the default model took ~40 us of every greedy token. */
static int32_t llamad_pick_first_max(struct llama_sampler * chain, const float * logits,
                                     int32_t n_vocab, llama_token * out) {
    const float first = logits[0];
    if (isnan(first)) {
        return llamad_pick(chain, first, 0, out);
    }
    float max = first;
    int32_t i = 0;
#if defined(__SSE2__)
    {
        __m128 m0 = _mm_set1_ps(first), m1 = m0, m2 = m0, m3 = m0;
        for (; i + 16 <= n_vocab; i += 16) {
            m0 = _mm_max_ps(_mm_loadu_ps(logits + i), m0);
            m1 = _mm_max_ps(_mm_loadu_ps(logits + i + 4), m1);
            m2 = _mm_max_ps(_mm_loadu_ps(logits + i + 8), m2);
            m3 = _mm_max_ps(_mm_loadu_ps(logits + i + 12), m3);
        }
        float lanes[16];
        _mm_storeu_ps(lanes, m0);
        _mm_storeu_ps(lanes + 4, m1);
        _mm_storeu_ps(lanes + 8, m2);
        _mm_storeu_ps(lanes + 12, m3);
        for (int j = 0; j < 16; j++) {
            max = lanes[j] > max ? lanes[j] : max;
        }
    }
#endif
    for (; i < n_vocab; i++) {
        max = logits[i] > max ? logits[i] : max;
    }
    int32_t best = 0;
#if defined(__SSE2__)
    {
        /* To the block of four holding the first entry equal to the largest;
         * the loop below finds it in the block. */
        const __m128 want = _mm_set1_ps(max);
        for (; best + 4 <= n_vocab; best += 4) {
            if (_mm_movemask_ps(_mm_cmpeq_ps(_mm_loadu_ps(logits + best), want)) != 0) {
                break;
            }
        }
    }
#endif
    while (!(logits[best] == max)) {
        best++;
    }
    return llamad_pick(chain, max, best, out);
}

/* True for a chain that is llama.cpp's greedy sampler alone (no grammar,
 * penalties or biases): its pick depends on the raw logits only. */
static bool llamad_greedy_only(struct llama_sampler * chain) {
    return llama_sampler_chain_n(chain) == 1 &&
           strcmp(llama_sampler_name(llama_sampler_chain_get(chain, 0)), "greedy") == 0;
}

/* Apply the chain to one row of logits and accept the token it picked, with a
 * check llama_sampler_sample lacks: when every candidate was ruled out (a
 * grammar that nothing satisfies once biases are applied) it returns 2
 * *before* accepting the token, since accepting it would make the grammar
 * abort the process. `scratch` holds n_vocab entries. */
static int32_t llamad_sample_row(struct llama_sampler * chain, const float * logits,
                                 llama_token_data * scratch, int32_t n_vocab, llama_token * out) {
    if (llamad_greedy_only(chain)) {
        /* Filling n_vocab candidates (0.6 MB at 49,152 tokens, cache-cold
         * after a decode) was most of a greedy step's sampling time. */
        return llamad_pick_first_max(chain, logits, n_vocab, out);
    }
    for (int32_t i = 0; i < n_vocab; i++) {
        scratch[i].id = i;
        scratch[i].logit = logits[i];
        scratch[i].p = 0.0f;
    }
    llama_token_data_array cur = { scratch, (size_t) n_vocab, -1, false };
    llama_sampler_apply(chain, &cur);
    if (cur.selected < 0 || (size_t) cur.selected >= cur.size) {
        return 2;
    }
    const llama_token_data picked = cur.data[cur.selected];
    return llamad_pick(chain, picked.logit, picked.id, out);
}

/* Sample one token from output row `idx`: what llama_sampler_sample does,
 * with two checks it lacks. A row without logits returns 1 instead of
 * tripping an assert; a chain that rules out every candidate returns 2 (see
 * llamad_sample_row). `scratch` holds n_vocab entries, reused across calls so
 * sampling allocates nothing. */
int32_t llamad_sample(struct llama_sampler * chain, struct llama_context * ctx, int32_t idx,
                      llama_token_data * scratch, int32_t n_vocab, llama_token * out) {
    const float * logits = llama_get_logits_ith(ctx, idx);
    if (logits == NULL) {
        return 1;
    }
    return llamad_sample_row(chain, logits, scratch, n_vocab, out);
}

/* Sample one token from a logits row the caller holds (a row kept from an
 * earlier decode, SPEC M3's memoised primer): the same candidates, the same
 * chain and the same checks as llamad_sample, so the same token as that
 * decode's row gives. Returns 1 for a missing row or a bad size, 2 as above. */
int32_t llamad_sample_logits(struct llama_sampler * chain, const float * logits,
                             llama_token_data * scratch, int32_t n_vocab, llama_token * out) {
    if (logits == NULL || n_vocab <= 0) {
        return 1;
    }
    return llamad_sample_row(chain, logits, scratch, n_vocab, out);
}

/* Log-probabilities of one logits row (SPEC M13): the log-softmax of `chosen`
 * and the `k` most likely tokens, most likely first. In Python a log-softmax
 * over a 49,152-token vocabulary costs ~13 ms per generated token; here well
 * under a millisecond. Ties go to the smaller id, as llama.cpp's greedy sampler
 * picks, so the top entry of a greedy step is the sampled token. The sum runs in
 * double so that a large vocabulary does not lose the tail. Returns the number
 * of top entries written (min(k, n_vocab)), -1 for a bad argument, -2 when a
 * logit is NaN (or every logit is -inf). */
int32_t llamad_logprobs(const float * logits, int32_t n_vocab, llama_token chosen, int32_t k,
                        llama_token * top_ids, float * top_logprobs, float * chosen_logprob) {
    if (logits == NULL || n_vocab <= 0 || chosen < 0 || chosen >= n_vocab || k < 0) {
        return -1;
    }
    if (k > n_vocab) {
        k = n_vocab;
    }
    float max = -INFINITY;
    for (int32_t i = 0; i < n_vocab; i++) {
        float l = logits[i];
        if (isnan(l)) {
            return -2;
        }
        if (l > max) {
            max = l;
        }
    }
    if (isinf(max)) {
        return -2;
    }
    double sum = 0.0;
    int32_t n_top = 0;
    for (int32_t i = 0; i < n_vocab; i++) {
        float l = logits[i];
        sum += (double) expf(l - max);
        if (k == 0 || (n_top == k && !(l > top_logprobs[k - 1]))) {
            continue;
        }
        /* Insertion into the sorted top list (raw logits until the end);
         * strict comparison keeps an earlier (smaller) id ahead of a tie. */
        int32_t j = n_top < k ? n_top : k - 1;
        while (j > 0 && l > top_logprobs[j - 1]) {
            top_logprobs[j] = top_logprobs[j - 1];
            top_ids[j] = top_ids[j - 1];
            j--;
        }
        top_logprobs[j] = l;
        top_ids[j] = i;
        if (n_top < k) {
            n_top++;
        }
    }
    double lse = (double) max + log(sum);
    for (int32_t j = 0; j < n_top; j++) {
        top_logprobs[j] = (float) ((double) top_logprobs[j] - lse);
    }
    *chosen_logprob = (float) ((double) logits[chosen] - lse);
    return n_top;
}

/* The build features a ggml backend registry reports (what
 * llama_print_system_info prints: the CPU instruction sets compiled in, CUDA's
 * architectures and kernel switches), as name/value pairs. Writes at most
 * `cap` pairs and returns how many the registry reports, or -1 when it reports
 * none (no ggml_backend_get_features). The strings are the backend's own,
 * static for the life of the process. */
int32_t llamad_backend_features(ggml_backend_reg_t reg, const char ** names, const char ** values,
                                int32_t cap) {
    ggml_backend_get_features_t get_features =
        (ggml_backend_get_features_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_get_features");
    if (get_features == NULL) {
        return -1;
    }
    int32_t n = 0;
    for (struct ggml_backend_feature * f = get_features(reg); f != NULL && f->name != NULL; f++, n++) {
        if (n < cap) {
            names[n] = f->name;
            values[n] = f->value;
        }
    }
    return n;
}

/* Stopping a llama_decode under way (a cancel, a shutdown, a deadline).
 * ggml's CPU backend calls the context's abort callback from its calling
 * thread (thread 0) after every graph node, while the other threads wait at
 * the node's barrier: so it must be cheap. Disarmed, it is one load; armed,
 * one clock read per node (vDSO, tens of ns), and at most every `probe_ns`
 * one call into Python (`_llamad_abort_probe`, on the thread that called
 * llama_decode, which is inside it and owns nothing else) that looks for
 * cancels. Once it has answered true it keeps answering true until
 * disarmed. `reason`: 1 = `stop` set, 2 = the deadline passed, 3 = the
 * probe asked for it. Times are CLOCK_MONOTONIC nanoseconds (Python's
 * time.monotonic). */
struct llamad_abort {
    volatile int32_t armed;
    volatile int32_t stop;
    int32_t reason;
    int32_t probing;
    int64_t deadline_ns;
    int64_t probe_ns;
    int64_t next_probe_ns;
    int64_t checks;
    int64_t probes;
    void * owner;
};

static bool _llamad_abort_probe(void * owner);

int64_t llamad_monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t) ts.tv_sec * 1000000000LL + (int64_t) ts.tv_nsec;
}

static bool llamad_abort_check(void * data) {
    struct llamad_abort * a = (struct llamad_abort *) data;
    if (!a->armed) {
        return false;
    }
    if (a->reason != 0) {
        return true;
    }
    a->checks++;
    if (a->stop) {
        a->reason = 1;
        return true;
    }
    const int64_t now = llamad_monotonic_ns();
    if (a->deadline_ns > 0 && now >= a->deadline_ns) {
        a->reason = 2;
        return true;
    }
    if (a->probing && now >= a->next_probe_ns) {
        a->probes++;
        if (_llamad_abort_probe(a->owner)) {
            a->reason = 3;
            return true;
        }
        /* From the probe's end: a slow probe never runs back to back. */
        a->next_probe_ns = llamad_monotonic_ns() + a->probe_ns;
    }
    return false;
}

void llamad_abort_install(struct llama_context * ctx, struct llamad_abort * a) {
    llama_set_abort_callback(ctx, a == NULL ? NULL : llamad_abort_check, a);
}
