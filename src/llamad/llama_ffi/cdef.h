/* The part of the pinned llama.h (and ggml/gguf) that llamad binds.
 *
 * API mode: every declaration here is checked by the C compiler against the
 * real headers, so structs are partial (`...;`) and enum values are taken from
 * the headers (`...`) instead of being copied by hand.
 */

typedef int32_t llama_pos;
typedef int32_t llama_token;
typedef int32_t llama_seq_id;

struct llama_vocab;
struct llama_model;
struct llama_context;
struct llama_sampler;
struct llama_adapter_lora;
struct llama_memory_i;
typedef struct llama_memory_i * llama_memory_t;
struct gguf_context;
struct ggml_context;

#define LLAMA_DEFAULT_SEED ...
#define LLAMA_TOKEN_NULL ...

enum ggml_log_level {
    GGML_LOG_LEVEL_NONE,
    GGML_LOG_LEVEL_DEBUG,
    GGML_LOG_LEVEL_INFO,
    GGML_LOG_LEVEL_WARN,
    GGML_LOG_LEVEL_ERROR,
    GGML_LOG_LEVEL_CONT,
    ...
};
typedef void (*ggml_log_callback)(enum ggml_log_level level, const char * text, void * user_data);

enum ggml_type {
    GGML_TYPE_F32,
    GGML_TYPE_F16,
    GGML_TYPE_Q4_0,
    GGML_TYPE_Q4_1,
    GGML_TYPE_Q5_0,
    GGML_TYPE_Q5_1,
    GGML_TYPE_Q8_0,
    GGML_TYPE_IQ4_NL,
    GGML_TYPE_BF16,
    GGML_TYPE_COUNT,
    ...
};

enum llama_split_mode {
    LLAMA_SPLIT_MODE_NONE,
    LLAMA_SPLIT_MODE_LAYER,
    LLAMA_SPLIT_MODE_ROW,
    LLAMA_SPLIT_MODE_TENSOR,
    ...
};

enum llama_load_mode {
    LLAMA_LOAD_MODE_AUTO,
    LLAMA_LOAD_MODE_NONE,
    LLAMA_LOAD_MODE_MMAP,
    LLAMA_LOAD_MODE_MLOCK,
    LLAMA_LOAD_MODE_MMAP_MLOCK,
    LLAMA_LOAD_MODE_DIRECT_IO,
    ...
};

enum llama_pooling_type {
    LLAMA_POOLING_TYPE_UNSPECIFIED,
    LLAMA_POOLING_TYPE_NONE,
    LLAMA_POOLING_TYPE_MEAN,
    LLAMA_POOLING_TYPE_CLS,
    LLAMA_POOLING_TYPE_LAST,
    LLAMA_POOLING_TYPE_RANK,
    ...
};

enum llama_rope_scaling_type {
    LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED,
    LLAMA_ROPE_SCALING_TYPE_NONE,
    LLAMA_ROPE_SCALING_TYPE_LINEAR,
    LLAMA_ROPE_SCALING_TYPE_YARN,
    LLAMA_ROPE_SCALING_TYPE_LONGROPE,
    ...
};

enum llama_flash_attn_type {
    LLAMA_FLASH_ATTN_TYPE_AUTO,
    LLAMA_FLASH_ATTN_TYPE_DISABLED,
    LLAMA_FLASH_ATTN_TYPE_ENABLED,
    ...
};

enum llama_ftype { ... };

typedef bool (*llama_progress_callback)(float progress, void * user_data);

typedef struct llama_batch {
    int32_t n_tokens;
    llama_token  *  token;
    float        *  embd;
    llama_pos    *  pos;
    int32_t      *  n_seq_id;
    llama_seq_id ** seq_id;
    int8_t       *  logits;
} llama_batch;

struct llama_model_params {
    int32_t n_gpu_layers;
    enum llama_split_mode split_mode;
    enum llama_load_mode  load_mode;
    int32_t main_gpu;
    const float * tensor_split;
    llama_progress_callback progress_callback;
    void * progress_callback_user_data;
    bool vocab_only;
    bool check_tensors;
    bool use_extra_bufts;
    ...;
};

/* Quantizing a model file (tests make a K-quant model from the default one). */
struct llama_model_quantize_params {
    int32_t nthread;
    enum llama_ftype ftype;
    bool allow_requantize;
    ...;
};

struct llama_context_params {
    uint32_t n_ctx;
    uint32_t n_batch;
    uint32_t n_ubatch;
    uint32_t n_seq_max;
    int32_t  n_threads;
    int32_t  n_threads_batch;
    enum llama_rope_scaling_type rope_scaling_type;
    enum llama_pooling_type    pooling_type;
    enum llama_flash_attn_type flash_attn_type;
    float    rope_freq_base;
    float    rope_freq_scale;
    float    yarn_ext_factor;
    float    yarn_attn_factor;
    float    yarn_beta_fast;
    float    yarn_beta_slow;
    uint32_t yarn_orig_ctx;
    enum ggml_type type_k;
    enum ggml_type type_v;
    bool embeddings;
    bool offload_kqv;
    bool no_perf;
    bool swa_full;
    bool kv_unified;
    ...;
};

typedef struct llama_token_data {
    llama_token id;
    float logit;
    float p;
} llama_token_data;

typedef struct llama_token_data_array {
    llama_token_data * data;
    size_t size;
    int64_t selected;
    bool sorted;
} llama_token_data_array;

typedef struct llama_logit_bias {
    llama_token token;
    float bias;
} llama_logit_bias;

typedef struct llama_sampler_chain_params {
    bool no_perf;
    ...;
} llama_sampler_chain_params;

typedef struct llama_chat_message {
    const char * role;
    const char * content;
} llama_chat_message;

/* Every value: the pure-Python reader's literals are compared with them
 * (llamad.llama_ffi.gguf_reader; tests/unit/llama_ffi/test_ffi_abi_literals.py). */
enum gguf_type {
    GGUF_TYPE_UINT8,
    GGUF_TYPE_INT8,
    GGUF_TYPE_UINT16,
    GGUF_TYPE_INT16,
    GGUF_TYPE_UINT32,
    GGUF_TYPE_INT32,
    GGUF_TYPE_FLOAT32,
    GGUF_TYPE_BOOL,
    GGUF_TYPE_STRING,
    GGUF_TYPE_ARRAY,
    GGUF_TYPE_UINT64,
    GGUF_TYPE_INT64,
    GGUF_TYPE_FLOAT64,
    GGUF_TYPE_COUNT,
    ...
};
#define GGUF_VERSION ...
#define GGUF_DEFAULT_ALIGNMENT ...
#define GGML_MAX_DIMS ...
#define GGML_MAX_NAME ...

struct gguf_init_params {
    bool no_alloc;
    struct ggml_context ** ctx;
};

/* --- process-wide ------------------------------------------------------ */
void llama_backend_init(void);
const char * llama_print_system_info(void);
size_t llama_max_devices(void);
size_t llama_max_parallel_sequences(void);
bool llama_supports_mmap(void);
bool llama_supports_mlock(void);
bool llama_supports_gpu_offload(void);
void llama_log_set(ggml_log_callback log_callback, void * user_data);
const char * llama_ftype_name(enum llama_ftype ftype);

/* --- the build: ggml's version and the backends it registered -------------- */
const char * ggml_version(void);
const char * ggml_commit(void);
struct ggml_backend_reg;
typedef struct ggml_backend_reg * ggml_backend_reg_t;
struct ggml_backend_device;
typedef struct ggml_backend_device * ggml_backend_dev_t;
enum ggml_backend_dev_type {
    GGML_BACKEND_DEVICE_TYPE_CPU,
    GGML_BACKEND_DEVICE_TYPE_GPU,
    GGML_BACKEND_DEVICE_TYPE_IGPU,
    GGML_BACKEND_DEVICE_TYPE_ACCEL,
    ...
};
size_t ggml_backend_reg_count(void);
ggml_backend_reg_t ggml_backend_reg_get(size_t index);
const char * ggml_backend_reg_name(ggml_backend_reg_t reg);
size_t ggml_backend_dev_count(void);
ggml_backend_dev_t ggml_backend_dev_get(size_t index);
enum ggml_backend_dev_type ggml_backend_dev_type(ggml_backend_dev_t device);
ggml_backend_reg_t ggml_backend_dev_backend_reg(ggml_backend_dev_t device);

/* --- host buffers for states (issue 21): a device's host buffer type is
 * pinned memory on CUDA (host-to-device copies at full speed), NULL on the CPU
 * device (plain memory: llamad maps its own). See llama_ffi/state.py. */
struct ggml_backend_buffer_type;
typedef struct ggml_backend_buffer_type * ggml_backend_buffer_type_t;
struct ggml_backend_buffer;
typedef struct ggml_backend_buffer * ggml_backend_buffer_t;
ggml_backend_buffer_type_t ggml_backend_dev_host_buffer_type(ggml_backend_dev_t device);
const char * ggml_backend_buft_name(ggml_backend_buffer_type_t buft);
ggml_backend_buffer_t ggml_backend_buft_alloc_buffer(ggml_backend_buffer_type_t buft, size_t size);
void ggml_backend_buffer_free(ggml_backend_buffer_t buffer);
void * ggml_backend_buffer_get_base(ggml_backend_buffer_t buffer);
size_t ggml_backend_buffer_get_size(ggml_backend_buffer_t buffer);
/* Plain host memory through the same calls: how the CPU build tests them. */
ggml_backend_buffer_type_t ggml_backend_cpu_buffer_type(void);

/* --- model --------------------------------------------------------------- */
struct llama_model_params llama_model_default_params(void);
struct llama_model * llama_model_load_from_file(const char * path_model, struct llama_model_params params);
void llama_model_free(struct llama_model * model);
const struct llama_vocab * llama_model_get_vocab(const struct llama_model * model);
int32_t llama_model_n_ctx_train(const struct llama_model * model);
int32_t llama_model_n_embd(const struct llama_model * model);
int32_t llama_model_n_layer(const struct llama_model * model);
int32_t llama_model_n_head(const struct llama_model * model);
int32_t llama_model_n_head_kv(const struct llama_model * model);
int32_t llama_model_meta_val_str(const struct llama_model * model, const char * key, char * buf, size_t buf_size);
int32_t llama_model_meta_count(const struct llama_model * model);
int32_t llama_model_meta_key_by_index(const struct llama_model * model, int32_t i, char * buf, size_t buf_size);
int32_t llama_model_meta_val_str_by_index(const struct llama_model * model, int32_t i, char * buf, size_t buf_size);
int32_t llama_model_desc(const struct llama_model * model, char * buf, size_t buf_size);
enum llama_ftype llama_model_ftype(const struct llama_model * model);
struct llama_model_quantize_params llama_model_quantize_default_params(void);
uint32_t llama_model_quantize(const char * fname_inp, const char * fname_out, const struct llama_model_quantize_params * params);
uint64_t llama_model_size(const struct llama_model * model);
uint64_t llama_model_n_params(const struct llama_model * model);
const char * llama_model_chat_template(const struct llama_model * model, const char * name);
bool llama_model_has_encoder(const struct llama_model * model);
bool llama_model_is_recurrent(const struct llama_model * model);

/* --- vocab --------------------------------------------------------------- */
int32_t llama_vocab_n_tokens(const struct llama_vocab * vocab);
bool llama_vocab_is_eog(const struct llama_vocab * vocab, llama_token token);
bool llama_vocab_is_control(const struct llama_vocab * vocab, llama_token token);
llama_token llama_vocab_bos(const struct llama_vocab * vocab);
llama_token llama_vocab_eos(const struct llama_vocab * vocab);
llama_token llama_vocab_eot(const struct llama_vocab * vocab);
llama_token llama_vocab_nl(const struct llama_vocab * vocab);
llama_token llama_vocab_pad(const struct llama_vocab * vocab);
bool llama_vocab_get_add_bos(const struct llama_vocab * vocab);
bool llama_vocab_get_add_eos(const struct llama_vocab * vocab);
int32_t llama_tokenize(const struct llama_vocab * vocab, const char * text, int32_t text_len,
                       llama_token * tokens, int32_t n_tokens_max, bool add_special, bool parse_special);
int32_t llama_token_to_piece(const struct llama_vocab * vocab, llama_token token, char * buf,
                             int32_t length, int32_t lstrip, bool special);
int32_t llama_detokenize(const struct llama_vocab * vocab, const llama_token * tokens, int32_t n_tokens,
                         char * text, int32_t text_len_max, bool remove_special, bool unparse_special);

/* --- context --------------------------------------------------------------- */
struct llama_context_params llama_context_default_params(void);
struct llama_context * llama_init_from_model(struct llama_model * model, struct llama_context_params params);
void llama_free(struct llama_context * ctx);
uint32_t llama_n_ctx(const struct llama_context * ctx);
uint32_t llama_n_ctx_seq(const struct llama_context * ctx);
uint32_t llama_n_batch(const struct llama_context * ctx);
uint32_t llama_n_ubatch(const struct llama_context * ctx);
uint32_t llama_n_seq_max(const struct llama_context * ctx);
int32_t llama_n_threads(struct llama_context * ctx);
int32_t llama_n_threads_batch(struct llama_context * ctx);
void llama_set_n_threads(struct llama_context * ctx, int32_t n_threads, int32_t n_threads_batch);
enum llama_pooling_type llama_pooling_type(const struct llama_context * ctx);
llama_memory_t llama_get_memory(const struct llama_context * ctx);
void llama_set_embeddings(struct llama_context * ctx, bool embeddings);
void llama_synchronize(struct llama_context * ctx);

/* --- threads: ggml threadpool (SPEC M14; see llama_ffi/threadpool.py) ------
 * In the pinned CPU build ggml runs its graph under OpenMP: a threadpool then
 * carries only each thread's priority and CPU mask (poll is unused), and
 * ggml's barriers are libgomp's (bounded by GOMP_SPINCOUNT). */
#define GGML_MAX_N_THREADS ...
enum ggml_sched_priority {
    GGML_SCHED_PRIO_LOW,
    GGML_SCHED_PRIO_NORMAL,
    GGML_SCHED_PRIO_MEDIUM,
    GGML_SCHED_PRIO_HIGH,
    GGML_SCHED_PRIO_REALTIME,
    ...
};
struct ggml_threadpool_params {
    bool cpumask[...];
    int n_threads;
    enum ggml_sched_priority prio;
    uint32_t poll;
    bool strict_cpu;
    bool paused;
    ...;
};
struct ggml_threadpool;
typedef struct ggml_threadpool * ggml_threadpool_t;
struct ggml_threadpool_params ggml_threadpool_params_default(int n_threads);
struct ggml_threadpool * ggml_threadpool_new(struct ggml_threadpool_params * params);
void ggml_threadpool_free(struct ggml_threadpool * threadpool);
void llama_attach_threadpool(struct llama_context * ctx, ggml_threadpool_t threadpool,
                             ggml_threadpool_t threadpool_batch);
void llama_detach_threadpool(struct llama_context * ctx);
/* --- end of threads ------------------------------------------------------- */

/* --- batch / decode -------------------------------------------------------- */
struct llama_batch llama_batch_init(int32_t n_tokens, int32_t embd, int32_t n_seq_max);
void llama_batch_free(struct llama_batch batch);
int32_t llama_decode(struct llama_context * ctx, struct llama_batch batch);
float * llama_get_logits_ith(struct llama_context * ctx, int32_t i);
float * llama_get_embeddings_ith(struct llama_context * ctx, int32_t i);
float * llama_get_embeddings_seq(struct llama_context * ctx, llama_seq_id seq_id);

/* --- memory (sequence ops) ------------------------------------------------- */
void llama_memory_clear(llama_memory_t mem, bool data);
bool llama_memory_seq_rm(llama_memory_t mem, llama_seq_id seq_id, llama_pos p0, llama_pos p1);
void llama_memory_seq_cp(llama_memory_t mem, llama_seq_id seq_id_src, llama_seq_id seq_id_dst,
                         llama_pos p0, llama_pos p1);
void llama_memory_seq_keep(llama_memory_t mem, llama_seq_id seq_id);
void llama_memory_seq_add(llama_memory_t mem, llama_seq_id seq_id, llama_pos p0, llama_pos p1,
                          llama_pos delta);
llama_pos llama_memory_seq_pos_min(llama_memory_t mem, llama_seq_id seq_id);
llama_pos llama_memory_seq_pos_max(llama_memory_t mem, llama_seq_id seq_id);
/* llamad's patch 0004: one past the highest cell holding seq_id (-1: any) */
int32_t llama_memory_seq_cell_end(llama_memory_t mem, llama_seq_id seq_id);
bool llama_memory_can_shift(llama_memory_t mem);

/* --- state of one sequence ------------------------------------------------- */
size_t llama_state_seq_get_size(struct llama_context * ctx, llama_seq_id seq_id);
size_t llama_state_seq_get_data(struct llama_context * ctx, uint8_t * dst, size_t size, llama_seq_id seq_id);
size_t llama_state_seq_set_data(struct llama_context * ctx, const uint8_t * src, size_t size,
                                llama_seq_id dest_seq_id);

/* --- sampling -------------------------------------------------------------- */
struct llama_sampler_chain_params llama_sampler_chain_default_params(void);
struct llama_sampler * llama_sampler_chain_init(struct llama_sampler_chain_params params);
void llama_sampler_chain_add(struct llama_sampler * chain, struct llama_sampler * smpl);
int32_t llama_sampler_chain_n(const struct llama_sampler * chain);
const char * llama_sampler_name(const struct llama_sampler * smpl);
void llama_sampler_accept(struct llama_sampler * smpl, llama_token token);
void llama_sampler_apply(struct llama_sampler * smpl, llama_token_data_array * cur_p);
struct llama_sampler * llama_sampler_chain_get(struct llama_sampler * chain, int32_t i);
void llama_sampler_reset(struct llama_sampler * smpl);
void llama_sampler_free(struct llama_sampler * smpl);
llama_token llama_sampler_sample(struct llama_sampler * smpl, struct llama_context * ctx, int32_t idx);
uint32_t llama_sampler_get_seed(const struct llama_sampler * smpl);
struct llama_sampler * llama_sampler_init_greedy(void);
struct llama_sampler * llama_sampler_init_dist(uint32_t seed);
struct llama_sampler * llama_sampler_init_top_k(int32_t k);
struct llama_sampler * llama_sampler_init_top_p(float p, size_t min_keep);
struct llama_sampler * llama_sampler_init_min_p(float p, size_t min_keep);
struct llama_sampler * llama_sampler_init_typical(float p, size_t min_keep);
struct llama_sampler * llama_sampler_init_temp(float t);
struct llama_sampler * llama_sampler_init_grammar(const struct llama_vocab * vocab,
                                                  const char * grammar_str, const char * grammar_root);
struct llama_sampler * llama_sampler_init_penalties(int32_t n_vocab, int32_t penalty_last_n,
                                                    float penalty_repeat, float penalty_freq,
                                                    float penalty_present);
struct llama_sampler * llama_sampler_init_logit_bias(int32_t n_vocab, int32_t n_logit_bias,
                                                     const llama_logit_bias * logit_bias);

/* --- LoRA adapters --------------------------------------------------------- */
struct llama_adapter_lora * llama_adapter_lora_init(struct llama_model * model, const char * path_lora);
void llama_adapter_lora_free(struct llama_adapter_lora * adapter);
int32_t llama_adapter_meta_count(const struct llama_adapter_lora * adapter);
int32_t llama_adapter_meta_key_by_index(const struct llama_adapter_lora * adapter, int32_t i, char * buf,
                                        size_t buf_size);
int32_t llama_adapter_meta_val_str_by_index(const struct llama_adapter_lora * adapter, int32_t i,
                                            char * buf, size_t buf_size);
int32_t llama_set_adapters_lora(struct llama_context * ctx, struct llama_adapter_lora ** adapters,
                                size_t n_adapters, float * scales);

/* --- built-in chat templates ----------------------------------------------- */
int32_t llama_chat_apply_template(const char * tmpl, const struct llama_chat_message * chat, size_t n_msg,
                                  bool add_ass, char * buf, int32_t length);
int32_t llama_chat_builtin_templates(const char ** output, size_t len);

/* --- ggml's GGUF reader ------------------------------------------------------
 * llamad reads headers in Python (llamad.llama_ffi.gguf_reader: the root and the
 * front must not load libllama); the tests hold that reader equal to this one. */
struct gguf_context * gguf_init_from_file(const char * fname, struct gguf_init_params params);
void gguf_free(struct gguf_context * ctx);
uint32_t gguf_get_version(const struct gguf_context * ctx);
size_t gguf_get_data_offset(const struct gguf_context * ctx);
int64_t gguf_get_n_tensors(const struct gguf_context * ctx);
size_t gguf_get_tensor_offset(const struct gguf_context * ctx, int64_t tensor_id);
size_t gguf_get_tensor_size(const struct gguf_context * ctx, int64_t tensor_id);
int64_t gguf_find_key(const struct gguf_context * ctx, const char * key);
enum gguf_type gguf_get_kv_type(const struct gguf_context * ctx, int64_t key_id);
size_t gguf_get_alignment(const struct gguf_context * ctx);
int64_t gguf_get_n_kv(const struct gguf_context * ctx);
const char * gguf_get_key(const struct gguf_context * ctx, int64_t key_id);
const char * gguf_get_tensor_name(const struct gguf_context * ctx, int64_t tensor_id);
enum ggml_type gguf_get_tensor_type(const struct gguf_context * ctx, int64_t tensor_id);
int64_t ggml_blck_size(enum ggml_type type);
size_t ggml_type_size(enum ggml_type type);

/* --- shim.c ---------------------------------------------------------------- */
void llamad_log_install(int min_level);
int32_t llamad_batch_add_seq(struct llama_batch * batch, int32_t capacity, const llama_token * tokens,
                             int32_t n_tokens, llama_pos pos0, llama_seq_id seq_id, int8_t logits_last);
int32_t llamad_batch_check(const struct llama_batch * batch, int32_t n_vocab, int32_t n_seq_max,
                           llama_pos n_ctx_seq, int32_t * bad_row);
int32_t llamad_tokens_check(const llama_token * tokens, int32_t n_tokens, int32_t n_vocab);
int32_t llamad_sample(struct llama_sampler * chain, struct llama_context * ctx, int32_t idx,
                      llama_token_data * scratch, int32_t n_vocab, llama_token * out);
int32_t llamad_sample_logits(struct llama_sampler * chain, const float * logits,
                             llama_token_data * scratch, int32_t n_vocab, llama_token * out);
void llamad_prefault(uint8_t * data, size_t size, size_t page);
int32_t llamad_logprobs(const float * logits, int32_t n_vocab, llama_token chosen, int32_t k,
                        llama_token * top_ids, float * top_logprobs, float * chosen_logprob);
int32_t llamad_backend_features(ggml_backend_reg_t reg, const char ** names, const char ** values,
                                int32_t cap);

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
int64_t llamad_monotonic_ns(void);
void llamad_abort_install(struct llama_context * ctx, struct llamad_abort * a);
extern "Python" bool _llamad_abort_probe(void * owner);
extern "Python" void _llamad_log_cb(enum ggml_log_level level, const char * text, void * user_data);
extern "Python" bool _llamad_progress_cb(float progress, void * user_data);
