// y = x @ w.T for weights kept as llama.cpp's blocks of 32 (4-bit or 8-bit codes with a float
// scale and offset per block), dequantised in registers: float32 activations and accumulation.
//
// Why not torch's _weight_int4pack_mm_for_cpu: it takes bfloat16 activations and dequantises the
// weights again for every 4 rows, so at 16 rows it runs at a third of the CPU's float32 rate and
// at prefill sizes 2-3x slower than a dense matmul. Here a weight panel (16 outputs x up to 256
// inputs) is dequantised once into an L1-sized buffer and then serves every row through a
// 6-row x 16-column float32 micro-kernel (the register blocking of BLIS-style GEMMs); at 1-4 rows
// the dequantised vectors feed the FMAs straight from registers.
//
// Every output is one chain of FMAs over the inputs in order, starting from zero, whichever path
// and however many rows the call has: a row's result does not depend on the batch around it.
//
// Layout (made by ruvllm_candle_like/blockmm.py): outputs in panels of 16; per panel, per input k,
// the 16 codes (4-bit: 8 bytes, byte j = output j in the low nibble and output j + 8 in the high
// one; 5-bit: those 8 bytes, then 2 bytes whose bit j is output j's fifth bit; 8-bit: 16 signed
// bytes); per panel, per block of 32 inputs, 16 scales d and 16 offsets m:
// w = code * d + m. Scales and offsets are float16 where every one of them is exact in it (the
// GGUF's own f16 values: Q4_0, Q4_1, Q8_0), the K-quants' two factors (d and the 6-bit sc,
// multiplied when loaded: exact), else float32: a 4-bit block then reads 20 or 18.5 bytes instead
// of 24, and the values the FMAs see are the same bits either way.
//
// x86-64 with AVX2, FMA and F16C only; blockmm_supported() says whether this build and CPU run it.
#include <stdint.h>
#include <stdlib.h>

#include "kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define BLOCKMM_X86 1
#endif

extern "C" int blockmm_supported(void) {
#ifdef BLOCKMM_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
#else
    return 0;
#endif
}

#ifdef BLOCKMM_X86
// Only the kernels take AVX2, FMA and F16C: the entry points must run on any x86-64 to say no.
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace {

constexpr int PANEL = 16;  // outputs per panel: two 8-float vectors
constexpr int BLOCK = 32;  // inputs per scale/offset
constexpr int MR = 6;      // rows per micro-kernel call: 12 accumulators + 2 weights + 1 broadcast
constexpr int KC = 256;    // inputs per dequantised chunk: 16 KB of float32, stays in L1
constexpr int DIRECT = 4;  // up to this many rows, no buffer: dequantise and multiply in registers

template <int BITS>
constexpr int code_bytes() { return BITS == 4 ? 8 : BITS == 5 ? 10 : 16; }

using ruvllm::load_scales8;

// Eight outputs' fifth bits (a byte) as int32 lanes of 0 or 16: one 8 KB table, read twice per
// input, where spreading the bits in registers took seven instructions per eight outputs (5-bit
// codes ran 1.3x slower than 8-bit ones at one row).
struct FifthBits {
    alignas(32) int32_t lanes[256][8];
    constexpr FifthBits() : lanes() {
        for (int b = 0; b < 256; b++)
            for (int j = 0; j < 8; j++) lanes[b][j] = (b >> j & 1) * 16;
    }
};
constexpr FifthBits FIFTH{};

template <int BITS>
inline void dequant16(const uint8_t *c, __m256 d0, __m256 d1, __m256 m0, __m256 m1, __m256 &w0, __m256 &w1) {
    __m256i q0, q1;
    if constexpr (BITS == 4 || BITS == 5) {
        __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i *>(c));
        __m128i mask = _mm_set1_epi8(0x0F);
        q0 = _mm256_cvtepu8_epi32(_mm_and_si128(v, mask));
        q1 = _mm256_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(v, 4), mask));
        if constexpr (BITS == 5) {
            // Output j's fifth bit is bit j of c[8..9].
            q0 = _mm256_or_si256(q0, _mm256_load_si256(reinterpret_cast<const __m256i *>(FIFTH.lanes[c[8]])));
            q1 = _mm256_or_si256(q1, _mm256_load_si256(reinterpret_cast<const __m256i *>(FIFTH.lanes[c[9]])));
        }
    } else {
        __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i *>(c));
        q0 = _mm256_cvtepi8_epi32(v);
        q1 = _mm256_cvtepi8_epi32(_mm_srli_si128(v, 8));
    }
    w0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q0), d0, m0);
    w1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q1), d1, m1);
}

// Named accumulators rather than an array: GCC keeps an array of __m256 on the stack.
#define ACC_DECL(i) __m256 a##i##0 = _mm256_setzero_ps(), a##i##1 = _mm256_setzero_ps();
#define ACC_LOAD(i) if (R > i && !first) { a##i##0 = _mm256_loadu_ps(y + i * ldy); a##i##1 = _mm256_loadu_ps(y + i * ldy + 8); }
#define ACC_FMA(i, src) if (R > i) { __m256 a = _mm256_broadcast_ss(src); \
    a##i##0 = _mm256_fmadd_ps(a, w0, a##i##0); a##i##1 = _mm256_fmadd_ps(a, w1, a##i##1); }
#define ACC_STORE(i) if (R > i) { _mm256_storeu_ps(y + i * ldy, a##i##0); _mm256_storeu_ps(y + i * ldy + 8, a##i##1); }

// R <= DIRECT rows of x (row stride k_total) against one panel, dequantising in registers.
template <int BITS, int FMT, int R>
void direct(const float *x, int64_t k_total, const uint8_t *codes, const void *d, const void *m,
            float *y, int64_t ldy) {
    ACC_DECL(0) ACC_DECL(1) ACC_DECL(2) ACC_DECL(3)
    for (int64_t g = 0; g < k_total / BLOCK; g++) {
        __m256 d0 = load_scales8<FMT>(d, g * PANEL), d1 = load_scales8<FMT>(d, g * PANEL + 8);
        __m256 m0 = load_scales8<FMT>(m, g * PANEL), m1 = load_scales8<FMT>(m, g * PANEL + 8);
        const uint8_t *c = codes + g * BLOCK * code_bytes<BITS>();
        const float *xg = x + g * BLOCK;
#pragma GCC unroll 4
        for (int kk = 0; kk < BLOCK; kk++) {
            __m256 w0, w1;
            dequant16<BITS>(c + kk * code_bytes<BITS>(), d0, d1, m0, m1, w0, w1);
            ACC_FMA(0, xg + kk) ACC_FMA(1, xg + k_total + kk) ACC_FMA(2, xg + 2 * k_total + kk)
            ACC_FMA(3, xg + 3 * k_total + kk)
        }
    }
    ACC_STORE(0) ACC_STORE(1) ACC_STORE(2) ACC_STORE(3)
}

// Inputs [k0, k0 + kc) of one panel as float32, [kc][16].
template <int BITS, int FMT>
void dequant_chunk(int64_t k0, int64_t kc, const uint8_t *codes, const void *d, const void *m, float *buf) {
    for (int64_t g = k0 / BLOCK; g < (k0 + kc) / BLOCK; g++) {
        __m256 d0 = load_scales8<FMT>(d, g * PANEL), d1 = load_scales8<FMT>(d, g * PANEL + 8);
        __m256 m0 = load_scales8<FMT>(m, g * PANEL), m1 = load_scales8<FMT>(m, g * PANEL + 8);
        for (int kk = 0; kk < BLOCK; kk++) {
            int64_t k = g * BLOCK + kk;
            __m256 w0, w1;
            dequant16<BITS>(codes + k * code_bytes<BITS>(), d0, d1, m0, m1, w0, w1);
            _mm256_store_ps(buf + (k - k0) * PANEL, w0);
            _mm256_store_ps(buf + (k - k0) * PANEL + 8, w1);
        }
    }
}

// R <= MR rows, packed [kc][R], against a dequantised chunk; continues y's sums unless first.
template <int R>
void micro(const float *xp, int64_t kc, const float *buf, float *y, int64_t ldy, bool first) {
    ACC_DECL(0) ACC_DECL(1) ACC_DECL(2) ACC_DECL(3) ACC_DECL(4) ACC_DECL(5)
    ACC_LOAD(0) ACC_LOAD(1) ACC_LOAD(2) ACC_LOAD(3) ACC_LOAD(4) ACC_LOAD(5)
#pragma GCC unroll 4
    for (int64_t k = 0; k < kc; k++) {
        __m256 w0 = _mm256_load_ps(buf + k * PANEL), w1 = _mm256_load_ps(buf + k * PANEL + 8);
        const float *xk = xp + k * R;
        ACC_FMA(0, xk) ACC_FMA(1, xk + 1) ACC_FMA(2, xk + 2) ACC_FMA(3, xk + 3) ACC_FMA(4, xk + 4)
        ACC_FMA(5, xk + 5)
    }
    ACC_STORE(0) ACC_STORE(1) ACC_STORE(2) ACC_STORE(3) ACC_STORE(4) ACC_STORE(5)
}

using MicroFn = void (*)(const float *, int64_t, const float *, float *, int64_t, bool);
constexpr MicroFn MICROS[MR + 1] = {nullptr, micro<1>, micro<2>, micro<3>, micro<4>, micro<5>, micro<6>};

using DirectFn = void (*)(const float *, int64_t, const uint8_t *, const void *, const void *, float *, int64_t);
template <int BITS, int FMT>
constexpr DirectFn DIRECTS[DIRECT + 1] = {nullptr, direct<BITS, FMT, 1>, direct<BITS, FMT, 2>,
                                          direct<BITS, FMT, 3>, direct<BITS, FMT, 4>};

template <int BITS, int FMT>
int run(const float *x, int64_t rows, int64_t k_total, int64_t n_total, const uint8_t *codes,
        const void *d, const void *m, float *y, int threads) {
    // Pointer arithmetic on the scales in their own format's bytes.
    const auto *ds = static_cast<const char *>(d), *ms = static_cast<const char *>(m);
    const int64_t panels = n_total / PANEL;
    const int64_t panel_codes = k_total * code_bytes<BITS>();
    const int64_t panel_scales = ruvllm::scale_bytes<FMT>(k_total / BLOCK);
    if (rows <= DIRECT) {
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int64_t p = 0; p < panels; p++)
            for (int64_t r = 0; r < rows; r += DIRECT) {
                int64_t rr = rows - r < DIRECT ? rows - r : DIRECT;
                DIRECTS<BITS, FMT>[rr](x + r * k_total, k_total, codes + p * panel_codes, ds + p * panel_scales,
                                       ms + p * panel_scales, y + r * n_total + p * PANEL, n_total);
            }
        return 0;
    }
    // x in groups of MR rows, each group [k][rows of the group]: the micro-kernel's broadcasts
    // then read consecutive floats.
    float *xp = static_cast<float *>(malloc(sizeof(float) * rows * k_total));
    if (xp == nullptr) return -1;
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(static)
        for (int64_t r0 = 0; r0 < rows; r0 += MR) {
            int64_t rr = rows - r0 < MR ? rows - r0 : MR;
            float *dst = xp + r0 * k_total;
            for (int64_t k = 0; k < k_total; k++)
                for (int64_t i = 0; i < rr; i++) dst[k * rr + i] = x[(r0 + i) * k_total + k];
        }
        float *buf = static_cast<float *>(aligned_alloc(64, sizeof(float) * KC * PANEL));
        if (buf == nullptr) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp barrier
        if (!failed) {
#pragma omp for schedule(static)
            for (int64_t p = 0; p < panels; p++) {
                for (int64_t k0 = 0; k0 < k_total; k0 += KC) {
                    int64_t kc = k_total - k0 < KC ? k_total - k0 : KC;
                    dequant_chunk<BITS, FMT>(k0, kc, codes + p * panel_codes, ds + p * panel_scales,
                                             ms + p * panel_scales, buf);
                    for (int64_t r0 = 0; r0 < rows; r0 += MR) {
                        int64_t rr = rows - r0 < MR ? rows - r0 : MR;
                        MICROS[rr](xp + r0 * k_total + k0 * rr, kc, buf, y + r0 * n_total + p * PANEL,
                                   n_total, k0 == 0);
                    }
                }
            }
        }
        free(buf);
    }
    free(xp);
    return failed ? -1 : 0;
}

}  // namespace
#pragma GCC pop_options
#endif

// y [rows, n] = x [rows, k] @ w.T; n a multiple of 16 and k of 32 (of 256 for K_FACTORS), all
// contiguous; d and m in scale_format (kernels.h's ScaleFormat); int8 (1 or 2, kernels.h): the codes in blockmm_int8.cpp's layout,
// run there. Returns 0, or -1 when memory ran out or -2 when this build or CPU cannot run it
// (blockmm_supported() == 0).
extern "C" int blockmm(const float *x, int64_t rows, int64_t k, int64_t n, int bits, int scale_format, int int8,
                       const uint8_t *codes, const void *d, const void *m, float *y, int threads) {
    if (int8) return blockmm_int8(x, rows, k, n, bits, scale_format, codes, d, m, y, threads, int8);
#ifdef BLOCKMM_X86
    return ruvllm::by_block_format(bits, scale_format, [&](auto b, auto format) {
        return run<b(), format()>(x, rows, k, n, codes, d, m, y, threads);
    });
#endif
    (void)x; (void)rows; (void)k; (void)n; (void)bits; (void)scale_format; (void)codes; (void)d; (void)m;
    (void)y; (void)threads;
    return -2;
}
