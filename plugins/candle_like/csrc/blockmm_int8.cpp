// y = x @ w.T on llama.cpp's blocks with the activations quantised to int8 as llama.cpp does for
// them (Q8_1: per block of 32 inputs a scale da = max|x| / 127, the codes round(x / da), and the
// block's sum of codes times da), and the products as integer dot products (AVX512-VNNI vpdpbusd:
// 64 byte products a cycle where float32 FMAs do 16).
//
// Why: on the AVX-512 kind the float32 kernel (blockmm.cpp) runs prefill at the CPU's FMA peak and
// still trails a bf16 dense matmul 2.2x (oneDNN on avx512_bf16), which would need a second,
// dense copy of the weights. Integer dot products on the same codes go past both at the GGUF's
// bytes, and they are what llama.cpp itself computes.
//
// Per block b of 32 inputs, output o and row r, with unsigned weight codes u (w = u * d + m):
//   sum_i w_i x_i ~= d[o] * da[r] * sum_i u_i qa_i + m[o] * sa[r],  sa = da * sum_i qa_i
// Q8_0's signed codes are stored as u = q + 128 with m = -128 d, so one kernel serves both.
// Every row is quantised alone and its outputs summed block by block in input order: a row's
// result does not depend on the rows beside it.
//
// Two instruction sets, the same bits: AVX512-VNNI (vpdpbusd on 16 outputs at once) and AVX2
// (vpmaddubsw then vpmaddwd on 8: pairs of 4-bit code x int8 products stay under 2 * 15 * 127, so
// a block's sixteen-bit sums cannot saturate; 8-bit codes go as two nibbles, u = 16 h + l). One
// quantiser serves both, the integer sums are exact either way and the float epilogue is the same
// operations in the same order, so a row's result does not depend on which ran.
//
// Layout (ruvllm_candle_like/blockmm.py, layout "int8"): outputs in panels of 16; per panel, per
// block, 4-bit: 4 chunks of 64 bytes, chunk g byte 4 o + j = u[o, 4g + j] | u[o, 16 + 4g + j] << 4;
// 5-bit: those 4 chunks of the low nibbles, then per chunk g two 64-bit masks, bit 4 o + j of
// mask h the fifth bit of u[o, 16 h + 4g + j]; 8-bit: 8 chunks of 64 bytes, chunk g byte 4 o + j
// = u[o, 4g + j]. Scales and offsets as in blockmm.cpp: per panel, per block, 16 each, in a
// ScaleFormat (kernels.h).
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

// Whether this CPU runs the VNNI path (the AVX2 one runs wherever blockmm.cpp's kernel does).
extern "C" int blockmm_int8_vnni(void) {
#ifdef RUVLLM_X86
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("f16c");
#else
    return 0;
#endif
}

#ifdef RUVLLM_X86
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
namespace {

constexpr int PANEL = 16;
constexpr int BLOCK = 32;

// Code bytes of one panel's block of 32 inputs.
template <int BITS>
constexpr int64_t block_bytes() { return BITS == 4 ? 256 : BITS == 5 ? 320 : 512; }

using PanelFn = void (*)(const int8_t *, int64_t, const float *, const float *, const uint8_t *, const void *,
                         const void *, float *, int64_t);

}  // namespace

namespace vnni {

constexpr int MR = 8;  // rows per pass over a panel: 8 integer + 8 float accumulators

// A block's 16 scales (or offsets) of a panel as float32, i = block * 16 (kernels.h's ScaleFormat).
template <int FMT>
inline __m512 load16(const void *p, int64_t i) {
    if constexpr (FMT == ruvllm::F16) {
        return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(static_cast<const uint16_t *>(p) + i)));
    } else if constexpr (FMT == ruvllm::F32) {
        return _mm512_loadu_ps(static_cast<const float *>(p) + i);
    } else {
        const auto *sb = static_cast<const uint8_t *>(p) + i / 128 * 160;
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(sb)));
        const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i *>(sb + 32 + i % 128));
        return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(sc)), d);
    }
}

inline __m512i bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

// R rows (quantised, row stride k) against one panel; y's 16 outputs of each row written.
template <int BITS, int FMT, int R>
void panel_rows(const int8_t *qa, int64_t k, const float *da, const float *sa, const uint8_t *codes,
                const void *d, const void *m, float *y, int64_t ldy) {
    const int64_t nb = k / BLOCK;
    __m512 f[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) f[r] = _mm512_setzero_ps();
    const __m512i low = _mm512_set1_epi8(0x0F);
    for (int64_t b = 0; b < nb; b++) {
        const __m512 dv = load16<FMT>(d, b * PANEL), mv = load16<FMT>(m, b * PANEL);
        __m512i acc[R];
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_si512();
        const int8_t *xb = qa + b * BLOCK;
        if constexpr (BITS == 4 || BITS == 5) {
            const uint8_t *c = codes + b * block_bytes<BITS>();
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++) {
                const __m512i w = _mm512_loadu_si512(c + 64 * g);
                __m512i lo = _mm512_and_si512(w, low), hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), low);
                if constexpr (BITS == 5) {
                    uint64_t fifth[2];
                    memcpy(fifth, c + 256 + 16 * g, 16);
                    lo = _mm512_or_si512(lo, _mm512_maskz_mov_epi8(fifth[0], _mm512_set1_epi8(16)));
                    hi = _mm512_or_si512(hi, _mm512_maskz_mov_epi8(fifth[1], _mm512_set1_epi8(16)));
                }
#pragma GCC unroll 8
                for (int r = 0; r < R; r++) {
                    acc[r] = _mm512_dpbusd_epi32(acc[r], lo, bcast4(xb + r * k + 4 * g));
                    acc[r] = _mm512_dpbusd_epi32(acc[r], hi, bcast4(xb + r * k + 16 + 4 * g));
                }
            }
        } else {
            const uint8_t *c = codes + b * 512;
#pragma GCC unroll 8
            for (int g = 0; g < 8; g++) {
                const __m512i w = _mm512_loadu_si512(c + 64 * g);
#pragma GCC unroll 8
                for (int r = 0; r < R; r++) acc[r] = _mm512_dpbusd_epi32(acc[r], w, bcast4(xb + r * k + 4 * g));
            }
        }
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            f[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r]), _mm512_mul_ps(dv, _mm512_set1_ps(da[r * nb + b])), f[r]);
            f[r] = _mm512_fmadd_ps(mv, _mm512_set1_ps(sa[r * nb + b]), f[r]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) _mm512_storeu_ps(y + r * ldy, f[r]);
}

template <int BITS, int FMT>
constexpr PanelFn PANELS[MR + 1] = {nullptr, panel_rows<BITS, FMT, 1>, panel_rows<BITS, FMT, 2>,
                                    panel_rows<BITS, FMT, 3>, panel_rows<BITS, FMT, 4>, panel_rows<BITS, FMT, 5>,
                                    panel_rows<BITS, FMT, 6>, panel_rows<BITS, FMT, 7>, panel_rows<BITS, FMT, 8>};

}  // namespace vnni
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
// AVX2 has 16 vector registers. With temporary expression replacement GCC computed all of a
// block's products before adding any and spilled them to the stack: off, each product is added as
// it is made (1.4-1.5x on 16-512 rows, the same bits).
#pragma GCC optimize("no-tree-ter")
namespace avx2 {

constexpr int MR = 4;  // rows per pass over half a panel: 4 sixteen-bit + 4 float accumulators

using ruvllm::load_scales8;

inline float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

inline int32_t hsum8i(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1)));
}

// One row: codes q [k], per block its scale da and scaled code sum sa. Both paths quantise with
// it: the cost is the row's size, not the matmul's, and one quantiser is the same codes by
// construction.
void quantize_row(const float *x, int64_t k, int8_t *q, float *da, float *sa) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < k / BLOCK; b++) {
        __m256 v[4], mx = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++) {
            v[i] = _mm256_loadu_ps(x + b * BLOCK + 8 * i);
            mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[i]));
        }
        const float amax = hmax8(mx);
        const float d = amax / 127.0f;
        const __m256 id = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
        // Round to nearest even (the default MXCSR mode), as llama.cpp's AVX quantiser does.
        __m256i sum = _mm256_setzero_si256();
        for (int i = 0; i < 4; i++) {
            const __m256i c = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], id));
            sum = _mm256_add_epi32(sum, c);
            const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
            _mm_storel_epi64(reinterpret_cast<__m128i *>(q + b * BLOCK + 8 * i), _mm_packs_epi16(w, w));
        }
        da[b] = d;
        sa[b] = d * static_cast<float>(hsum8i(sum));
    }
}

inline __m256i bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

// 16 in byte i of 32 where bit i of the 32-bit mask at p is set: 5-bit codes' fifth bits.
inline __m256i fifth_bits(const uint8_t *p) {
    uint32_t m;
    memcpy(&m, p, 4);
    // Byte i takes mask byte i / 8 (shuffles stay within 128-bit lanes, each holding all of m).
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
    const __m256i v = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int32_t>(m)), spread), bit);
    return _mm256_and_si256(_mm256_cmpeq_epi8(v, bit), _mm256_set1_epi8(16));
}

// Half h (outputs 8 h .. 8 h + 7) of chunk g of a block's codes c, its low and high nibbles as
// bytes: for 4-bit and 5-bit codes lo holds inputs 4 g + j and hi inputs 16 + 4 g + j (fifth
// bits put back for 5-bit codes); for 8-bit ones (BITS = 4 here) both nibbles of input 4 g + j.
template <int BITS>
inline void chunk_codes(const uint8_t *c, int g, int h, __m256i &lo, __m256i &hi) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(c + 64 * g + 32 * h));
    lo = _mm256_and_si256(w, low);
    hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), low);
    if constexpr (BITS == 5) {
        lo = _mm256_or_si256(lo, fifth_bits(c + 256 + 16 * g + 4 * h));
        hi = _mm256_or_si256(hi, fifth_bits(c + 256 + 16 * g + 8 + 4 * h));
    }
}

// R rows against outputs [8 h, 8 h + 8) of one panel.
template <int BITS, int FMT, int R>
void half_panel(int h, const int8_t *qa, int64_t k, const float *da, const float *sa, const uint8_t *codes,
                const void *d, const void *m, float *y, int64_t ldy) {
    const int64_t nb = k / BLOCK;
    const __m256i ones = _mm256_set1_epi16(1), sixteen = _mm256_set1_epi16(16);
    __m256 f[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) f[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const __m256 dv = load_scales8<FMT>(d, b * PANEL + 8 * h), mv = load_scales8<FMT>(m, b * PANEL + 8 * h);
        const int8_t *xb = qa + b * BLOCK;
        __m256i acc[R];
        if constexpr (BITS == 4 || BITS == 5) {
            // 4-bit codes: one sixteen-bit sum a row for the block, sixteen products of a code
            // under 16 and |q| <= 127 per lane reach 30,480. 5-bit ones: each half of the block
            // sums alone, eight products of a code under 32 reach 31,496. No saturation either way;
            // a second sum a row for 4-bit codes cost registers the rows need.
            constexpr int SUMS = BITS == 4 ? 1 : 2;
            __m256i s[SUMS][R];
#pragma GCC unroll 4
            for (int i = 0; i < SUMS; i++)
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) s[i][r] = _mm256_setzero_si256();
            const uint8_t *c = codes + b * block_bytes<BITS>();
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++) {
                __m256i lo, hi;
                chunk_codes<BITS>(c, g, h, lo, hi);
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) {
                    s[0][r] = _mm256_add_epi16(s[0][r], _mm256_maddubs_epi16(lo, bcast4(xb + r * k + 4 * g)));
                    s[SUMS - 1][r] = _mm256_add_epi16(s[SUMS - 1][r],
                                                      _mm256_maddubs_epi16(hi, bcast4(xb + r * k + 16 + 4 * g)));
                }
            }
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                acc[r] = _mm256_madd_epi16(s[0][r], ones);
                if constexpr (SUMS == 2) acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(s[1][r], ones));
            }
        } else {
            // u = 16 h + l: each nibble's products stay as small as 4-bit codes'.
            __m256i sl[R], sh[R];
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) sl[r] = sh[r] = _mm256_setzero_si256();
            const uint8_t *c = codes + b * block_bytes<8>();
#pragma GCC unroll 8
            for (int g = 0; g < 8; g++) {
                __m256i lo, hi;
                chunk_codes<4>(c, g, h, lo, hi);
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) {
                    const __m256i xq = bcast4(xb + r * k + 4 * g);
                    sl[r] = _mm256_add_epi16(sl[r], _mm256_maddubs_epi16(lo, xq));
                    sh[r] = _mm256_add_epi16(sh[r], _mm256_maddubs_epi16(hi, xq));
                }
            }
#pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                acc[r] = _mm256_add_epi32(_mm256_madd_epi16(sl[r], ones), _mm256_madd_epi16(sh[r], sixteen));
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            f[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[r]), _mm256_mul_ps(dv, _mm256_set1_ps(da[r * nb + b])), f[r]);
            f[r] = _mm256_fmadd_ps(mv, _mm256_set1_ps(sa[r * nb + b]), f[r]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) _mm256_storeu_ps(y + r * ldy + 8 * h, f[r]);
}

// One panel's nb blocks of 5-bit codes in the 8-bit layout: for calls whose rows pass over a
// panel more than once (a prompt), the fifth bits are put back once instead of once a pass.
void widen5(const uint8_t *codes, int64_t nb, uint8_t *wide) {
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *c = codes + b * block_bytes<5>();
        uint8_t *o = wide + b * block_bytes<8>();
        for (int g = 0; g < 4; g++)
            for (int h = 0; h < 2; h++) {
                __m256i lo, hi;
                chunk_codes<5>(c, g, h, lo, hi);
                // Inputs 4g + j are 8-bit chunk g, inputs 16 + 4g + j chunk 4 + g.
                _mm256_storeu_si256(reinterpret_cast<__m256i *>(o + 64 * g + 32 * h), lo);
                _mm256_storeu_si256(reinterpret_cast<__m256i *>(o + 64 * (4 + g) + 32 * h), hi);
            }
    }
}

template <int BITS, int FMT, int R>
void panel_rows(const int8_t *qa, int64_t k, const float *da, const float *sa, const uint8_t *codes, const void *d,
                const void *m, float *y, int64_t ldy) {
    half_panel<BITS, FMT, R>(0, qa, k, da, sa, codes, d, m, y, ldy);
    half_panel<BITS, FMT, R>(1, qa, k, da, sa, codes, d, m, y, ldy);
}

template <int BITS, int FMT>
constexpr PanelFn PANELS[MR + 1] = {nullptr, panel_rows<BITS, FMT, 1>, panel_rows<BITS, FMT, 2>,
                                    panel_rows<BITS, FMT, 3>, panel_rows<BITS, FMT, 4>};

}  // namespace avx2
#pragma GCC pop_options

namespace {

// Quantise every row, then each thread runs its panels over all rows, MR at a time. 5-bit codes
// with more than MR rows: each panel is widened to 8 bits once (avx2::widen5) and runs on the
// 8-bit kernel (wide_fn), the same integers.
template <int BITS, int FMT, int MR>
int run(const PanelFn *panels_fn, const PanelFn *wide_fn, const float *x, int64_t rows, int64_t k, int64_t n,
        const uint8_t *codes, const void *d, const void *m, float *y, int threads) {
    const int64_t nb = k / BLOCK, panels = n / PANEL;
    const int64_t panel_codes = nb * block_bytes<BITS>();
    const int64_t panel_scales = ruvllm::scale_bytes<FMT>(nb);
    const bool widen = BITS == 5 && rows > MR;
    const auto *ds = static_cast<const char *>(d), *ms = static_cast<const char *>(m);
    int8_t *qa = static_cast<int8_t *>(malloc(rows * k));
    float *da = static_cast<float *>(malloc(sizeof(float) * rows * nb));
    float *sa = static_cast<float *>(malloc(sizeof(float) * rows * nb));
    uint8_t *wide = widen ? static_cast<uint8_t *>(malloc(threads * nb * block_bytes<8>())) : nullptr;
    if (qa == nullptr || da == nullptr || sa == nullptr || (widen && wide == nullptr)) {
        free(qa); free(da); free(sa); free(wide);
        return -1;
    }
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) avx2::quantize_row(x + r * k, k, qa + r * k, da + r * nb, sa + r * nb);
        uint8_t *mine = widen ? wide + omp_get_thread_num() * nb * block_bytes<8>() : nullptr;
#pragma omp for schedule(static)
        for (int64_t p = 0; p < panels; p++) {
            const uint8_t *pc = codes + p * panel_codes;
            const PanelFn *fn = panels_fn;
            if (widen) {
                avx2::widen5(pc, nb, mine);
                pc = mine;
                fn = wide_fn;
            }
            for (int64_t r0 = 0; r0 < rows; r0 += MR) {
                const int64_t rr = rows - r0 < MR ? rows - r0 : MR;
                fn[rr](qa + r0 * k, k, da + r0 * nb, sa + r0 * nb, pc, ds + p * panel_scales, ms + p * panel_scales,
                       y + r0 * n + p * PANEL, n);
            }
        }
    }
    free(qa); free(da); free(sa); free(wide);
    return 0;
}

}  // namespace
#endif

int blockmm_int8(const float *x, int64_t rows, int64_t k, int64_t n, int bits, int scale_format,
                 const uint8_t *codes, const void *d, const void *m, float *y, int threads, int isa) {
#ifdef RUVLLM_X86
    static const int has_vnni = blockmm_int8_vnni();
    if (isa == 1 && has_vnni) {
        return ruvllm::by_block_format(bits, scale_format, [&](auto b, auto format) {
            return run<b(), format(), vnni::MR>(vnni::PANELS<b(), format()>, vnni::PANELS<8, format()>, x, rows,
                                              k, n, codes, d, m, y, threads);
        });
    }
    return ruvllm::by_block_format(bits, scale_format, [&](auto b, auto format) {
        return run<b(), format(), avx2::MR>(avx2::PANELS<b(), format()>, avx2::PANELS<8, format()>, x, rows, k,
                                          n, codes, d, m, y, threads);
    });
#endif
    (void)x; (void)rows; (void)k; (void)n; (void)bits; (void)scale_format; (void)codes; (void)d; (void)m;
    (void)y; (void)threads; (void)isa;
    return -2;
}
