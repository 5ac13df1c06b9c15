// Rows of a matrix kept on blocks, as float32: the token embeddings of a step read from a table
// held in the block kernel's layout (the embedded model's tied head). In torch ops this took a
// dozen small calls a step (61.5 us for one token, ~1 % of a one-client decode step); here one
// call takes 5.2 us.
//
// Output o's weight at input i is code * scale + offset, code * scale exact in float32 for every
// format (an f16 scale, the K-quants' d sc, the int8 layout's (q + 128) d), so the sum rounds
// once: the value blockmm.cpp's and blockmm_int8.cpp's products start from. Layouts and scale
// formats as ruvllm_candle_like/blockmm.py's BlockWeights says; scales read by kernels.h's
// load_scales8, as the matmuls read them.
#include <stdint.h>

#include "kernels.h"

#ifdef RUVLLM_X86
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace {

constexpr int64_t PANEL = 16;
constexpr int64_t GROUP = 32;

// Output lane of panel p's code at input i (float32 activations' layout: [panels, k, 8 | 10 | 16]).
template <int BITS>
int code_float_layout(const uint8_t *codes, int64_t p, int64_t k, int64_t i, int64_t lane) {
    if constexpr (BITS == 8) return static_cast<int8_t>(codes[(p * k + i) * PANEL + lane]);
    const uint8_t *at = codes + (p * k + i) * (BITS == 4 ? 8 : 10);
    const int low = lane < 8 ? at[lane] & 0x0F : at[lane - 8] >> 4;
    return BITS == 4 ? low : low | ((at[8 + lane / 8] >> (lane % 8)) & 1) << 4;
}

// The same from the int8 activations' layout ([panels, blocks, chunks, 64], blockmm_int8.cpp).
template <int BITS>
int code_int8_layout(const uint8_t *codes, int64_t p, int64_t nb, int64_t i, int64_t lane) {
    const int64_t b = i / GROUP, in = i % GROUP;
    const uint8_t *block = codes + (p * nb + b) * (BITS == 4 ? 4 : BITS == 5 ? 5 : 8) * 64;
    if constexpr (BITS == 8) return block[in / 4 * 64 + lane * 4 + in % 4];
    const int64_t half = in / 16, g = in % 16 / 4, j = in % 4;
    const int byte = block[g * 64 + lane * 4 + j];
    const int low = half ? byte >> 4 : byte & 0x0F;
    if constexpr (BITS == 4) return low;
    const int mask = block[4 * 64 + g * 16 + half * 8 + lane / 2];
    return low | ((mask >> (4 * (lane % 2) + j)) & 1) << 4;
}

// Block b's value (scale or offset) of output lane in a panel's values: the kernels' own loader.
template <int FMT>
float block_value(const void *panel_values, int64_t b, int64_t lane) {
    float eight[8];
    _mm256_storeu_ps(eight, ruvllm::load_scales8<FMT>(panel_values, b * PANEL + lane / 8 * 8));
    return eight[lane % 8];
}

template <int BITS, int FMT>
int rows_of(const int64_t *index, int64_t t, int64_t k, int int8_layout, const uint8_t *codes, const void *d,
            const void *m, float *out) {
    const int64_t nb = k / GROUP, panel_values = ruvllm::scale_bytes<FMT>(nb);
    for (int64_t r = 0; r < t; r++) {
        const int64_t p = index[r] / PANEL, lane = index[r] % PANEL;
        const void *dp = static_cast<const char *>(d) + p * panel_values;
        const void *mp = static_cast<const char *>(m) + p * panel_values;
        float *row = out + r * k;
        for (int64_t b = 0; b < nb; b++) {
            const float scale = block_value<FMT>(dp, b, lane), offset = block_value<FMT>(mp, b, lane);
            for (int64_t i = b * GROUP; i < (b + 1) * GROUP; i++) {
                const int code = int8_layout ? code_int8_layout<BITS>(codes, p, nb, i, lane)
                                             : code_float_layout<BITS>(codes, p, k, i, lane);
                row[i] = static_cast<float>(code) * scale + offset;
            }
        }
    }
    return 0;
}

}  // namespace
#pragma GCC pop_options
#endif

// out[r, :] = row index[r] of the [n, k] matrix (codes, d, m); 0, -1 when an index is outside
// [0, n) (nothing written), or -2 for a format it does not know (the caller's bug) or off x86-64.
extern "C" int block_rows(const int64_t *index, int64_t t, int64_t n, int64_t k, int bits, int scale_format,
                          int int8_layout, const uint8_t *codes, const void *d, const void *m, float *out) {
    for (int64_t r = 0; r < t; r++)
        if (index[r] < 0 || index[r] >= n) return -1;
#ifdef RUVLLM_X86
    return ruvllm::by_block_format(bits, scale_format, [&](auto b, auto format) {
        return rows_of<b(), format()>(index, t, k, int8_layout, codes, d, m, out);
    });
#else
    (void)k; (void)bits; (void)scale_format; (void)int8_layout; (void)codes; (void)d; (void)m; (void)out;
    return -2;
#endif
}
