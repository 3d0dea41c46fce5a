/*
 * Paged decode attention for the CPU: one query token per request, K/V read in place
 * through the block table (no gather copy), online softmax over the request's blocks (Milakov &
 * Gimelshein 2018, "Online normalizer calculation for softmax"), fp32 accumulation.
 *
 * Attention variants (brigade/attention/variants.py has the conventions, transformers'):
 *   sliding_window > 0: the query (position len - 1) reads only keys [len - sliding_window, len - 1]; the loop
 *     starts at the window's first key, so the blocks before it are never read;
 *   soft_cap > 0: each scaled score s becomes soft_cap * tanh(s / soft_cap);
 *   sinks != NULL: sinks[h] (fp32) joins query head h's softmax denominator as a logit with no value, which
 *     the online softmax takes as its starting state (max = sink, sum = 1).
 *
 * Layout, as the attention-backend interface fixes it for one layer:
 *   kv_cache [2][num_blocks][block_size][num_kv_heads][head_size]  (K at index 0, V at index 1)
 *   query    [num_reqs][num_heads][head_size]                      (contiguous)
 *   out      [num_reqs][num_heads][head_size]                      (contiguous, written)
 *   block_table [num_reqs][block_table_stride] int32, seq_lens [num_reqs] int32
 * Query head h reads KV head h / (num_heads / num_kv_heads) (grouped-query attention).
 *
 * Work is split over (request, KV head) pairs with OpenMP; the library links the libgomp that torch
 * has already loaded, so both share one thread pool. Built by brigade/attention/cpu_kernels.py.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

/* Per-program scratch bounds, passed by cpu_kernels.py (-DMAX_GROUP=... from its LIMITS), the one place
 * they are set; the Python side refuses larger shapes before calling. */
#if !defined(MAX_GROUP) || !defined(MAX_HEAD) || !defined(MAX_BLOCK)
#error "build with -DMAX_GROUP, -DMAX_HEAD and -DMAX_BLOCK (brigade/attention/cpu_kernels.py does)"
#endif

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = ((uint32_t)h) << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {  /* round to nearest even; inputs are finite */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* One (request, KV head): q [group][head] already scaled, accumulates into acc [group][head]. */
#define DEFINE_DECODE(NAME, T, LOAD, STORE)                                                              \
int NAME(T *out, const T *query, const T *k_cache, const T *v_cache, const int32_t *block_table,       \
         const int32_t *seq_lens, int64_t num_reqs, int64_t num_heads, int64_t num_kv_heads,          \
         int64_t head_size, int64_t block_size, int64_t block_table_stride, float scale,               \
         const float *sinks, int64_t sliding_window, float soft_cap) {                                 \
    const int64_t group = num_heads / num_kv_heads;                                                    \
    if (group > MAX_GROUP || head_size > MAX_HEAD || block_size > MAX_BLOCK) return 1;                 \
    const int64_t row = num_kv_heads * head_size;          /* elements between consecutive tokens */   \
    const int64_t block_elems = block_size * row;                                                      \
    _Pragma("omp parallel for schedule(dynamic, 1)")                                                   \
    for (int64_t item = 0; item < num_reqs * num_kv_heads; ++item) {                                   \
        const int64_t r = item / num_kv_heads, kvh = item % num_kv_heads;                             \
        const int32_t len = seq_lens[r];                                                               \
        float q[MAX_GROUP][MAX_HEAD], acc[MAX_GROUP][MAX_HEAD], m[MAX_GROUP], l[MAX_GROUP];            \
        float s[MAX_GROUP][MAX_BLOCK];                                                                 \
        for (int64_t g = 0; g < group; ++g) {                                                          \
            const T *qp = query + (r * num_heads + kvh * group + g) * head_size;                       \
            for (int64_t d = 0; d < head_size; ++d) { q[g][d] = LOAD(qp[d]) * scale; acc[g][d] = 0.f; } \
            m[g] = sinks ? sinks[kvh * group + g] : -3.0e38f;                                          \
            l[g] = sinks ? 1.f : 0.f;                                                                  \
        }                                                                                              \
        const int32_t *table = block_table + r * block_table_stride;                                   \
        const int64_t first = (sliding_window > 0 && len > sliding_window) ? len - sliding_window : 0; \
        for (int64_t start = first, n = 0; start < len; start += n) {                                  \
            const int64_t offset = start % block_size;                                                 \
            n = (len - start < block_size - offset) ? (len - start) : block_size - offset;             \
            const int64_t base = (int64_t)table[start / block_size] * block_elems + offset * row       \
                + kvh * head_size;                                                                     \
            const T *kb = k_cache + base, *vb = v_cache + base;                                        \
            for (int64_t t = 0; t < n; ++t) {                                                          \
                const T *kp = kb + t * row;                                                            \
                float kf[MAX_HEAD];                                                                    \
                _Pragma("omp simd")                                                                    \
                for (int64_t d = 0; d < head_size; ++d) kf[d] = LOAD(kp[d]);                           \
                for (int64_t g = 0; g < group; ++g) {                                                  \
                    float dot = 0.f;                                                                   \
                    _Pragma("omp simd reduction(+:dot)")                                               \
                    for (int64_t d = 0; d < head_size; ++d) dot += q[g][d] * kf[d];                    \
                    s[g][t] = soft_cap > 0.f ? soft_cap * tanhf(dot / soft_cap) : dot;                 \
                }                                                                                      \
            }                                                                                          \
            for (int64_t g = 0; g < group; ++g) {                                                      \
                float mx = m[g];                                                                       \
                for (int64_t t = 0; t < n; ++t) mx = s[g][t] > mx ? s[g][t] : mx;                      \
                const float rescale = expf(m[g] - mx);                                                 \
                float sum = 0.f;                                                                       \
                _Pragma("omp simd reduction(+:sum)")                                                   \
                for (int64_t t = 0; t < n; ++t) { s[g][t] = expf(s[g][t] - mx); sum += s[g][t]; }      \
                l[g] = l[g] * rescale + sum;                                                           \
                m[g] = mx;                                                                             \
                _Pragma("omp simd")                                                                    \
                for (int64_t d = 0; d < head_size; ++d) acc[g][d] *= rescale;                          \
            }                                                                                          \
            for (int64_t t = 0; t < n; ++t) {                                                          \
                const T *vp = vb + t * row;                                                            \
                float vf[MAX_HEAD];                                                                    \
                _Pragma("omp simd")                                                                    \
                for (int64_t d = 0; d < head_size; ++d) vf[d] = LOAD(vp[d]);                           \
                for (int64_t g = 0; g < group; ++g) {                                                  \
                    const float p = s[g][t];                                                           \
                    _Pragma("omp simd")                                                                \
                    for (int64_t d = 0; d < head_size; ++d) acc[g][d] += p * vf[d];                    \
                }                                                                                      \
            }                                                                                          \
        }                                                                                              \
        for (int64_t g = 0; g < group; ++g) {                                                          \
            T *op = out + (r * num_heads + kvh * group + g) * head_size;                               \
            const float inv = 1.f / l[g];                                                              \
            for (int64_t d = 0; d < head_size; ++d) op[d] = STORE(acc[g][d] * inv);                    \
        }                                                                                              \
    }                                                                                                  \
    return 0;                                                                                          \
}

#define LOAD_F32(x) (x)
#define STORE_F32(x) (x)
DEFINE_DECODE(brigade_decode_attention_f32, float, LOAD_F32, STORE_F32)
DEFINE_DECODE(brigade_decode_attention_bf16, uint16_t, bf16_to_f32, f32_to_bf16)

int brigade_kernels_abi_version(void) { return 2; }
