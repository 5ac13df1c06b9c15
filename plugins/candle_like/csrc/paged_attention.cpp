// Each row's query (a decode token, or one row of a short prompt chunk) against its sequence's
// K/V in the paged float16 pool, read in place.
//
// Why: the PyTorch path gathers every sequence's K/V out of the pool (index_select), widens them
// to float32 (a copy), pads the batch to its longest sequence and then runs SDPA over that: three
// passes over the K/V a step, which at 16 sequences of 600 positions cost more than the layer's
// matmuls. Here each (sequence, KV head) pair reads its keys and values once, straight from their
// pool slots, widening in registers (F16C).
//
// Per pair, the G query heads sharing the KV head: scores s = q.k / sqrt(D) over the sequence's
// positions in order, softmax in float32 (max subtracted, expf, normalised), then the values
// weighted and summed in position order. A pair's result depends only on its own query and K/V:
// a row gets the same bits whatever else is in the batch, and a chunk's row those of decoding it.
//
// Pool layout (ruvllm_candle_like/executor.py's _PoolStep): [slots, 2, kv_heads, dim] float16,
// K then V of a slot side by side. x86-64 with AVX2, FMA and F16C; dim a multiple of 8.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "kernels.h"


// Whether this CPU runs the kernels compiled for AVX2, FMA and F16C: this file's and decoder.cpp's.
extern "C" int avx2_fma_f16c_supported(void) {
#ifdef RUVLLM_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
    return 0;
#endif
}

#ifdef RUVLLM_X86
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace {

inline __m256 load_half8(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p)));
}

// G queries q [G][dim] (float32) of one KV head over n positions; out [G][dim]. ``rows`` is
// scratch for LANES widened K rows [LANES][dim], ``scores`` for [G][n]. LANES positions (or
// LANES partial sums of the values) at a time keep that many FMA chains in flight; which
// position goes to which chain is fixed, so the bits do not depend on anything but the pair.
constexpr int64_t LANES = 4;

void attend_pair(const float *q, int64_t groups, int64_t dim, const uint16_t *pool, int64_t slot_stride,
                 int64_t value_offset, const int64_t *slots, int64_t n, float scale, float *rows,
                 float *scores, float *out, int64_t out_stride) {
    for (int64_t l0 = 0; l0 < n; l0 += LANES) {
        const int64_t m = n - l0 < LANES ? n - l0 : LANES;
        for (int64_t j = 0; j < m; j++) {
            const uint16_t *key = pool + slots[l0 + j] * slot_stride;
            for (int64_t d = 0; d < dim; d += 8) _mm256_storeu_ps(rows + j * dim + d, load_half8(key + d));
        }
        for (int64_t g = 0; g < groups; g++) {
            __m256 acc[LANES] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
            for (int64_t d = 0; d < dim; d += 8) {
                const __m256 qd = _mm256_loadu_ps(q + g * dim + d);
                for (int64_t j = 0; j < LANES; j++)
                    acc[j] = _mm256_fmadd_ps(qd, _mm256_loadu_ps(rows + j * dim + d), acc[j]);
            }
            for (int64_t j = 0; j < m; j++) scores[g * n + l0 + j] = ruvllm::hsum8(acc[j]) * scale;
        }
    }
    for (int64_t g = 0; g < groups; g++) {
        float *s = scores + g * n;
        float top = -INFINITY;
        for (int64_t l = 0; l < n; l++) top = s[l] > top ? s[l] : top;
        float total = 0.0f;
        for (int64_t l = 0; l < n; l++) {
            s[l] = expf(s[l] - top);
            total += s[l];
        }
        const float inv = 1.0f / total;
        for (int64_t l = 0; l < n; l++) s[l] *= inv;
        for (int64_t d = 0; d < dim; d += 8) {
            __m256 acc[LANES] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
            const uint16_t *value = pool + value_offset + d;
            for (int64_t l = 0; l < n; l++)
                acc[l % LANES] = _mm256_fmadd_ps(_mm256_set1_ps(s[l]), load_half8(value + slots[l] * slot_stride),
                                                 acc[l % LANES]);
            __m256 sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
            _mm256_storeu_ps(out + g * out_stride + d, sum);
        }
    }
}

}  // namespace
#pragma GCC pop_options
#endif

// Declared in kernels.h.
extern "C" int paged_attention_rows(const float *q, int64_t q_stride, int64_t rows, int64_t heads,
                                    int64_t kv_heads, int64_t dim, const uint16_t *pool, const int64_t *slots,
                                    int64_t slot_count, const int64_t *starts, const int64_t *lengths, float *out,
                                    int threads) {
#ifdef RUVLLM_X86
    if (dim % 8 != 0 || kv_heads <= 0 || heads % kv_heads != 0) return -2;
    const int64_t groups = heads / kv_heads;
    const float scale = 1.0f / sqrtf(static_cast<float>(dim));
    const int64_t slot_stride = 2 * kv_heads * dim;
    int64_t longest = 1;
    for (int64_t b = 0; b < rows; b++) {
        if (lengths[b] < 0 || starts[b] < 0 || starts[b] + lengths[b] > slot_count) return -3;
        longest = lengths[b] > longest ? lengths[b] : longest;
    }
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        float *scores = static_cast<float *>(malloc(sizeof(float) * (groups * longest + LANES * dim)));
        if (scores == nullptr) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp barrier
        if (!failed) {
#pragma omp for schedule(dynamic, 1)
            for (int64_t pair = 0; pair < rows * kv_heads; pair++) {
                const int64_t b = pair / kv_heads, h = pair % kv_heads;
                if (lengths[b] == 0) continue;
                attend_pair(q + b * q_stride + h * groups * dim, groups, dim, pool + h * dim, slot_stride,
                            kv_heads * dim, slots + starts[b], lengths[b], scale, scores + groups * longest,
                            scores, out + (b * heads + h * groups) * dim, dim);
            }
        }
        free(scores);
    }
    return failed ? -1 : 0;
#else
    (void)q; (void)q_stride; (void)rows; (void)heads; (void)kv_heads; (void)dim; (void)pool; (void)slots;
    (void)slot_count; (void)starts; (void)lengths; (void)out; (void)threads;
    return -2;
#endif
}
