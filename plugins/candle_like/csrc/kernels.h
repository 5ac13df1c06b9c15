// What one kernel file of ruvllm's native library calls in another (decoder.cpp runs the whole
// layer stack on blockmm.cpp's matmuls and paged_attention.cpp's attention).
#pragma once
#include <stdint.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define RUVLLM_X86 1

#include <type_traits>

namespace ruvllm {

// Eight block scales (or offsets) from i on as float32, widened exactly when kept as float16.
template <bool HALF>
__attribute__((target("avx2,fma,f16c"))) inline __m256 load_scales8(const void *p, int64_t i) {
    if constexpr (HALF)
        return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(static_cast<const uint16_t *>(p) + i)));
    else
        return _mm256_loadu_ps(static_cast<const float *>(p) + i);
}

// run(bits, half) with both as compile-time constants, for the block formats the kernels take
// (4, 5 or 8 bits, float16 or float32 scales); -2 for any other.
template <typename Run>
int by_block_format(int bits, int half_scales, Run &&run) {
    using Four = std::integral_constant<int, 4>;
    using Five = std::integral_constant<int, 5>;
    using Eight = std::integral_constant<int, 8>;
    if (bits == 4) return half_scales ? run(Four{}, std::true_type{}) : run(Four{}, std::false_type{});
    if (bits == 5) return half_scales ? run(Five{}, std::true_type{}) : run(Five{}, std::false_type{});
    if (bits == 8) return half_scales ? run(Eight{}, std::true_type{}) : run(Eight{}, std::false_type{});
    return -2;
}

// The sum of v's lanes, always in the same order.
__attribute__((target("avx2,fma,f16c"))) inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

}  // namespace ruvllm
#endif

// blockmm.cpp: float32 activations (int8 = 0), or blockmm_int8.cpp's int8 activations on its own
// layout of the codes: int8 = 1 on the best instructions this CPU has, 2 on AVX2 whatever it has
// (the tests' way to run that path on a VNNI machine).
extern "C" int blockmm(const float *x, int64_t rows, int64_t k, int64_t n, int bits, int half_scales, int int8,
                       const uint8_t *codes, const void *d, const void *m, float *y, int threads);
int blockmm_int8(const float *x, int64_t rows, int64_t k, int64_t n, int bits, int half_scales,
                 const uint8_t *codes, const void *d, const void *m, float *y, int threads, int isa);

// Row b of q (stride q_stride floats: heads x dim, then anything) attends over the lengths[b] pool
// slots at slots + starts[b] of pool [slots, 2, kv_heads, dim] float16; a row of length 0 is left
// alone (someone else attends it). out [rows, heads * dim]. Returns 0, -1 when memory ran out, -2
// when unsupported, -3 when a row's slots run past slot_count.
extern "C" int paged_attention_rows(const float *q, int64_t q_stride, int64_t rows, int64_t heads,
                                    int64_t kv_heads, int64_t dim, const uint16_t *pool, const int64_t *slots,
                                    int64_t slot_count, const int64_t *starts, const int64_t *lengths, float *out,
                                    int threads);
