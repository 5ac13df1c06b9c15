// What one kernel file of ruvllm's native library calls in another (decoder.cpp runs the whole
// layer stack on blockmm.cpp's matmuls and paged_attention.cpp's attention).
#pragma once
#include <stdint.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define RUVLLM_X86 1

#include <type_traits>

namespace ruvllm {

// How a panel keeps its per-block scales (and, alike, its offsets), 16 outputs a block: float32;
// float16 (where that holds every value exactly); or the K-quants' two factors, exact products
// (d sc): per super-block of 8 blocks, the 16 outputs' float16 d, then 8 x 16 bytes sc.
enum ScaleFormat { F32 = 0, F16 = 1, K_FACTORS = 2 };

// A panel's bytes of scales for nb blocks.
template <int FMT>
constexpr int64_t scale_bytes(int64_t nb) {
    return FMT == F32 ? nb * 16 * 4 : FMT == F16 ? nb * 16 * 2 : nb / 8 * 160;
}

// Eight block scales (or offsets) of a panel as float32: outputs i % 16 .. + 7 of block i / 16.
template <int FMT>
__attribute__((target("avx2,fma,f16c"))) inline __m256 load_scales8(const void *p, int64_t i) {
    if constexpr (FMT == F16) {
        return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(static_cast<const uint16_t *>(p) + i)));
    } else if constexpr (FMT == F32) {
        return _mm256_loadu_ps(static_cast<const float *>(p) + i);
    } else {
        const auto *sb = static_cast<const uint8_t *>(p) + i / 128 * 160;
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(sb + (i % 16) * 2)));
        const __m128i sc = _mm_loadl_epi64(reinterpret_cast<const __m128i *>(sb + 32 + i % 128));
        return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sc)), d);
    }
}

// run(bits, format) with both as compile-time constants, for the block formats the kernels take
// (4, 5 or 8 bits; a ScaleFormat); -2 for any other.
template <typename Run>
int by_block_format(int bits, int scale_format, Run &&run) {
    auto with_format = [&](auto b) {
        if (scale_format == F32) return run(b, std::integral_constant<int, F32>{});
        if (scale_format == F16) return run(b, std::integral_constant<int, F16>{});
        if (scale_format == K_FACTORS) return run(b, std::integral_constant<int, K_FACTORS>{});
        return -2;
    };
    if (bits == 4) return with_format(std::integral_constant<int, 4>{});
    if (bits == 5) return with_format(std::integral_constant<int, 5>{});
    if (bits == 8) return with_format(std::integral_constant<int, 8>{});
    return -2;
}

// The sum of v's lanes, always in the same order.
__attribute__((target("avx2,fma,f16c"))) inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// e^x, Cephes' single-precision method (x = n ln2 + r, a degree-5 polynomial for e^r, n into the
// exponent): within 2 ulp of expf over [-87.3, 88.3], 8 lanes at a time. libm's expf one value at
// a time cost ~10 ms a step at 16 rows in SiLU (decoder.cpp), and a third of the pool attention's
// time at 16 rows of 600 positions (paged_attention.cpp).
__attribute__((target("avx2,fma,f16c"))) inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
    __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, x, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(x, x), x), _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

}  // namespace ruvllm
#endif

// blockmm.cpp: float32 activations (int8 = 0), or blockmm_int8.cpp's int8 activations on its own
// layout of the codes: int8 = 1 on the best instructions this CPU has, 2 on AVX2 whatever it has
// (the tests' way to run that path on a VNNI machine).
extern "C" int blockmm(const float *x, int64_t rows, int64_t k, int64_t n, int bits, int scale_format, int int8,
                       const uint8_t *codes, const void *d, const void *m, float *y, int threads);
int blockmm_int8(const float *x, int64_t rows, int64_t k, int64_t n, int bits, int scale_format,
                 const uint8_t *codes, const void *d, const void *m, float *y, int threads, int isa);

// Row b of q (stride q_stride floats: heads x dim, then anything) attends over the lengths[b] pool
// slots at slots + starts[b] of pool [slots, 2, kv_heads, dim] float16; a row of length 0 is left
// alone (someone else attends it). out [rows, heads * dim]. Returns 0, -1 when memory ran out, -2
// when unsupported, -3 when a row's slots run past slot_count.
extern "C" int paged_attention_rows(const float *q, int64_t q_stride, int64_t rows, int64_t heads,
                                    int64_t kv_heads, int64_t dim, const uint16_t *pool, const int64_t *slots,
                                    int64_t slot_count, const int64_t *starts, const int64_t *lengths, float *out,
                                    int threads);
