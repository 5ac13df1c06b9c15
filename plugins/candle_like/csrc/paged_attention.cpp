// Each row's query (a decode token, or one row of a short prompt chunk) against its sequence's
// K/V in the paged float16 pool, read in place.
//
// Why: the PyTorch path gathers every sequence's K/V out of the pool (index_select), widens them
// to float32 (a copy), pads the batch to its longest sequence and then runs SDPA over that: three
// passes over the K/V a step, which at 16 sequences of 600 positions cost more than the layer's
// matmuls. Here each (sequence, KV head) pair reads its keys and values once, straight from their
// pool slots, widening in registers (F16C).
//
// Per pair, the G query heads sharing the KV head: scores s = q.k / sqrt(D), eight positions at a
// time; e^(s - max) in float32, eight at a time; the values weighted and summed in position order,
// then divided by the weights' sum. A pair of more than SEGMENT positions runs as segments on any
// thread, each with its own max and sum, merged in order. Every sum's order is fixed by the
// sequence's length alone, so a pair's result depends only on its own query and K/V: a row gets
// the same bits whatever else is in the batch, and a chunk's row those of decoding it.
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

// Positions a score pass takes at once: their G scores come out as G vectors of 8.
constexpr int64_t POS = 8;
// How many positions ahead the score and value passes ask for a slot's cache lines. A pair reads
// 128 bytes of every 768-byte slot (its head's K, then its V), too sparse for the hardware
// prefetcher to run ahead: at 4,096 positions (94 MB of K/V a step, out of cache) the passes
// waited on memory at 6.5 GB/s; asked 32 ahead, 13-16 GB/s (48 and 64 measured alike).
constexpr int64_t AHEAD = 32;
// Positions a task attends at most: a pair longer than this is split into segments that run on
// any thread and are merged in order (merge_segments), so one long sequence's three pairs keep
// both threads busy. The split depends on the length alone, so the bits still do; up to SEGMENT
// positions a pair is one task, as before the split (segments of 256-512 were no faster at 4,096
// positions, and slower for 16 rows of 600).
constexpr int64_t SEGMENT = 1024;

// How many segments a pair of n positions runs as.
inline int64_t segments_of(int64_t n) { return (n + SEGMENT - 1) / SEGMENT; }

// Lane i: the sum of a[i]'s lanes, always in the same order.
inline __m256 sums8(const __m256 *a) {
    const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
    const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
    const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// Scores of G queries q [G][dim] against n keys, positions POS at a time: each key widened once
// into rows [POS][dim], then per query POS dot products in their own FMA chains, reduced
// together (sums8). scores [G][stride]; positions past n are scored against rows of zeros, for
// exponentiate's last vector to load (and mask).
void score_keys(const float *q, int64_t groups, int64_t dim, const uint16_t *pool, int64_t slot_stride,
                const int64_t *slots, int64_t n, float scale, float *rows, float *scores, int64_t stride) {
    for (int64_t l0 = 0; l0 < n; l0 += POS) {
        const int64_t m = n - l0 < POS ? n - l0 : POS;
        for (int64_t j = l0 + AHEAD; j < l0 + AHEAD + POS && j < n; j++) {
            const char *key = reinterpret_cast<const char *>(pool + slots[j] * slot_stride);
            for (int64_t b = 0; b < dim * 2; b += 64) _mm_prefetch(key + b, _MM_HINT_T0);
        }
        for (int64_t j = 0; j < POS; j++) {
            if (j < m) {
                const uint16_t *key = pool + slots[l0 + j] * slot_stride;
                for (int64_t d = 0; d < dim; d += 8) _mm256_storeu_ps(rows + j * dim + d, load_half8(key + d));
            } else {
                for (int64_t d = 0; d < dim; d += 8) _mm256_storeu_ps(rows + j * dim + d, _mm256_setzero_ps());
            }
        }
        for (int64_t g = 0; g < groups; g++) {
            __m256 acc[POS];
            for (int64_t j = 0; j < POS; j++) acc[j] = _mm256_setzero_ps();
            for (int64_t d = 0; d < dim; d += 8) {
                const __m256 qd = _mm256_loadu_ps(q + g * dim + d);
                for (int64_t j = 0; j < POS; j++)
                    acc[j] = _mm256_fmadd_ps(qd, _mm256_loadu_ps(rows + j * dim + d), acc[j]);
            }
            _mm256_storeu_ps(scores + g * stride + l0, _mm256_mul_ps(sums8(acc), _mm256_set1_ps(scale)));
        }
    }
}

// A query's n scores in place -> e^(s - max), returning their sum (and the max in ``top_out``);
// the sum in 8 lanes, then the lanes in a fixed order, so the bits depend on nothing but the scores.
float exponentiate(float *s, int64_t n, float *top_out) {
    __m256 top8 = _mm256_set1_ps(-INFINITY);
    int64_t l = 0;
    for (; l + 8 <= n; l += 8) top8 = _mm256_max_ps(top8, _mm256_loadu_ps(s + l));
    float top = -INFINITY;
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, top8);
    for (int i = 0; i < 8; i++) top = lanes[i] > top ? lanes[i] : top;
    for (int64_t i = l; i < n; i++) top = s[i] > top ? s[i] : top;
    *top_out = top;
    const __m256 top_v = _mm256_set1_ps(top);
    __m256 total8 = _mm256_setzero_ps();
    for (l = 0; l < n; l += 8) {
        __m256 e = ruvllm::exp8(_mm256_sub_ps(_mm256_loadu_ps(s + l), top_v));
        if (n - l < 8) {  // the lanes past n: zero
            const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            const __m256i kept = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n - l)), lane);
            e = _mm256_and_ps(e, _mm256_castsi256_ps(kept));
        }
        _mm256_storeu_ps(s + l, e);
        total8 = _mm256_add_ps(total8, e);
    }
    return ruvllm::hsum8(total8);
}

// out[g] = sum_l p[g][l] v_l / total[g] for GB queries and DB x 8 dims from ``value`` (a pool
// pointer at the first dim), positions in order, one FMA chain per (query, 8 dims).
template <int GB, int DB>
void weigh_values(const float *p, int64_t stride, const float *inv_total, const uint16_t *value,
                  int64_t slot_stride, const int64_t *slots, int64_t n, float *out, int64_t out_stride) {
    __m256 acc[GB][DB];
    for (int g = 0; g < GB; g++)
        for (int j = 0; j < DB; j++) acc[g][j] = _mm256_setzero_ps();
    for (int64_t l = 0; l < n; l++) {
        const uint16_t *v = value + slots[l] * slot_stride;
        if (l + AHEAD < n)
            _mm_prefetch(reinterpret_cast<const char *>(value + slots[l + AHEAD] * slot_stride), _MM_HINT_T0);
        __m256 vv[DB];
        for (int j = 0; j < DB; j++) vv[j] = load_half8(v + 8 * j);
        for (int g = 0; g < GB; g++) {
            const __m256 w = _mm256_set1_ps(p[g * stride + l]);
            for (int j = 0; j < DB; j++) acc[g][j] = _mm256_fmadd_ps(w, vv[j], acc[g][j]);
        }
    }
    for (int g = 0; g < GB; g++)
        for (int j = 0; j < DB; j++)
            _mm256_storeu_ps(out + g * out_stride + 8 * j, _mm256_mul_ps(acc[g][j], _mm256_set1_ps(inv_total[g])));
}

// The most queries and 8-dim vectors weigh_values takes at once: 3 x 2 FMA chains and 2 values
// in registers.
constexpr int64_t QUERY_BLOCK = 3, VECTOR_BLOCK = 2;

using WeighFn = void (*)(const float *, int64_t, const float *, const uint16_t *, int64_t, const int64_t *, int64_t,
                         float *, int64_t);
// [queries at once - 1][8-dim vectors at once - 1].
constexpr WeighFn WEIGH[QUERY_BLOCK][VECTOR_BLOCK] = {{weigh_values<1, 1>, weigh_values<1, 2>},
                                 {weigh_values<2, 1>, weigh_values<2, 2>},
                                 {weigh_values<3, 1>, weigh_values<3, 2>}};

// G queries q [G][dim] (float32) of one KV head over n positions; out [G][dim] (row stride
// out_stride) = the weighted values divided by the weights' sum, or (``partial``) that sum in
// ``total`` [G], the scores' max in ``top`` [G] and the weighted values undivided, for merge_segments.
// ``rows`` is scratch for POS widened keys, ``scores`` for [G][stride], stride >= n rounded up to
// POS. The order of every sum is fixed by n alone.
void attend_pair(const float *q, int64_t groups, int64_t dim, const uint16_t *pool, int64_t slot_stride,
                 int64_t value_offset, const int64_t *slots, int64_t n, float scale, float *rows,
                 float *scores, int64_t stride, float *out, int64_t out_stride, bool partial, float *top,
                 float *total) {
    score_keys(q, groups, dim, pool, slot_stride, slots, n, scale, rows, scores, stride);
    float ones[QUERY_BLOCK], inv_total[QUERY_BLOCK];
    for (float &one : ones) one = 1.0f;
    for (int64_t g0 = 0; g0 < groups; g0 += QUERY_BLOCK) {
        const int64_t gb = groups - g0 < QUERY_BLOCK ? groups - g0 : QUERY_BLOCK;
        for (int64_t g = 0; g < gb; g++) {
            float max, sum = exponentiate(scores + (g0 + g) * stride, n, &max);
            inv_total[g] = 1.0f / sum;
            if (partial) top[g0 + g] = max, total[g0 + g] = sum;
        }
        for (int64_t d = 0; d < dim; d += 8 * VECTOR_BLOCK) {
            const int64_t db = (dim - d) / 8 < VECTOR_BLOCK ? (dim - d) / 8 : VECTOR_BLOCK;
            WEIGH[gb - 1][db - 1](scores + g0 * stride, stride, partial ? ones : inv_total, pool + value_offset + d,
                                  slot_stride, slots, n, out + g0 * out_stride + d, out_stride);
        }
    }
}

// One pair's segments, in order: each query's weighted values and weights' sums rescaled to the
// largest max and added, then divided. seg_out [segments][G][dim], tops and totals [segments][G];
// tops is overwritten with each segment's rescaling factor.
void merge_segments(int64_t segments, int64_t groups, int64_t dim, const float *seg_out, float *tops,
                    const float *totals, float *out) {
    for (int64_t g = 0; g < groups; g++) {
        float top = -INFINITY;
        for (int64_t s = 0; s < segments; s++) top = tops[s * groups + g] > top ? tops[s * groups + g] : top;
        float total = 0.0f;
        for (int64_t s = 0; s < segments; s++) {
            tops[s * groups + g] = expf(tops[s * groups + g] - top);
            total += tops[s * groups + g] * totals[s * groups + g];
        }
        for (int64_t d = 0; d < dim; d += 8) {
            __m256 acc = _mm256_setzero_ps();
            for (int64_t s = 0; s < segments; s++)
                acc = _mm256_fmadd_ps(_mm256_set1_ps(tops[s * groups + g]),
                                      _mm256_loadu_ps(seg_out + (s * groups + g) * dim + d), acc);
            _mm256_storeu_ps(out + g * dim + d, _mm256_mul_ps(acc, _mm256_set1_ps(1.0f / total)));
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
    // Tasks: every (row, KV head, segment of SEGMENT positions), in that order; segments_before[b]
    // counts row b's first task. A pair of one segment writes its output, others write partials.
    int64_t *segments_before = static_cast<int64_t *>(malloc(sizeof(int64_t) * (rows + 1)));
    if (segments_before == nullptr) return -1;
    segments_before[0] = 0;
    for (int64_t b = 0; b < rows; b++)
        segments_before[b + 1] = segments_before[b] + kv_heads * segments_of(lengths[b]);
    const int64_t tasks = segments_before[rows];
    const int64_t stride = (longest < SEGMENT ? (longest + POS - 1) / POS * POS : SEGMENT);
    // One more float than the tasks need, so that a step with none still gets a block.
    float *partials = static_cast<float *>(malloc(sizeof(float) * (tasks * groups * (dim + 2) + 1)));
    if (partials == nullptr) {
        free(segments_before);
        return -1;
    }
    float *tops = partials + tasks * groups * dim, *totals = tops + tasks * groups;
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        float *scores = static_cast<float *>(malloc(sizeof(float) * (groups * stride + POS * dim)));
        if (scores == nullptr) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp barrier
        if (!failed) {
            int64_t b = 0;
#pragma omp for schedule(dynamic, 1)
            for (int64_t task = 0; task < tasks; task++) {
                while (segments_before[b + 1] <= task) b++;
                while (segments_before[b] > task) b--;
                const int64_t segments = segments_of(lengths[b]);
                const int64_t h = (task - segments_before[b]) / segments, s = (task - segments_before[b]) % segments;
                const int64_t lo = s * SEGMENT, n = lengths[b] - lo < SEGMENT ? lengths[b] - lo : SEGMENT;
                const bool partial = segments > 1;
                attend_pair(q + b * q_stride + h * groups * dim, groups, dim, pool + h * dim, slot_stride,
                            kv_heads * dim, slots + starts[b] + lo, n, scale, scores + groups * stride, scores,
                            stride, partial ? partials + task * groups * dim : out + (b * heads + h * groups) * dim,
                            dim, partial, tops + task * groups, totals + task * groups);
            }
#pragma omp for schedule(dynamic, 1)
            for (int64_t pair = 0; pair < rows * kv_heads; pair++) {
                const int64_t row = pair / kv_heads, h = pair % kv_heads;
                const int64_t segments = segments_of(lengths[row]);
                if (segments < 2) continue;
                const int64_t first = segments_before[row] + h * segments;
                merge_segments(segments, groups, dim, partials + first * groups * dim, tops + first * groups,
                               totals + first * groups, out + (row * heads + h * groups) * dim);
            }
        }
        free(scores);
    }
    free(partials);
    free(segments_before);
    return failed ? -1 : 0;
#else
    (void)q; (void)q_stride; (void)rows; (void)heads; (void)kv_heads; (void)dim; (void)pool; (void)slots;
    (void)slot_count; (void)starts; (void)lengths; (void)out; (void)threads;
    return -2;
#endif
}
