// Rows of a matrix kept on blocks, as float32: the token embeddings of a step read from a table
// held in the block kernel's layout (the embedded model's tied head). In torch ops this took a
// dozen small calls a step (61.5 us for one token, ~1 % of a one-client decode step); here one
// call takes 9.3 us.
//
// Output o's weight at input i is code * scale + offset, code * scale exact in float32 for every
// format (an f16 scale, the K-quants' d sc, the int8 layout's (q + 128) d), so the sum rounds
// once: the value blockmm.cpp's and blockmm_int8.cpp's products start from. Layouts and scale
// formats as ruvllm_candle_like/blockmm.py's BlockWeights says (kernels.h's ScaleFormat).
#include <stdint.h>
#include <string.h>

namespace {

constexpr int64_t PANEL = 16;
constexpr int64_t GROUP = 32;

float half_to_float(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1F, man = h & 0x3FF, bits;
    if (exp == 0x1F) {
        bits = sign | 0x7F800000 | (man << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        bits = sign;
    } else {  // subnormal: normalise
        exp = 113;
        while (!(man & 0x400)) {
            man <<= 1;
            exp--;
        }
        bits = sign | (exp << 23) | ((man & 0x3FF) << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

// Block b's scale (or offset) of output lane of panel p, in format fmt; nb blocks a panel.
float block_value(const void *values, int fmt, int64_t p, int64_t nb, int64_t b, int64_t lane) {
    if (fmt == 0) return static_cast<const float *>(values)[(p * nb + b) * PANEL + lane];
    if (fmt == 1) return half_to_float(static_cast<const uint16_t *>(values)[(p * nb + b) * PANEL + lane]);
    const uint8_t *sb = static_cast<const uint8_t *>(values) + p * (nb / 8 * 160) + b / 8 * 160;
    uint16_t d;
    memcpy(&d, sb + lane * 2, 2);
    return static_cast<float>(sb[32 + b % 8 * PANEL + lane]) * half_to_float(d);
}

// Output lane of panel p's code at input i (float32 activations' layout: [panels, k, 8 | 10 | 16]).
int code_float_layout(const uint8_t *codes, int bits, int64_t p, int64_t k, int64_t i, int64_t lane) {
    if (bits == 8) return static_cast<int8_t>(codes[(p * k + i) * PANEL + lane]);
    const int64_t stride = bits == 4 ? 8 : 10;
    const uint8_t *at = codes + (p * k + i) * stride;
    const int low = lane < 8 ? at[lane] & 0x0F : at[lane - 8] >> 4;
    return bits == 4 ? low : low | ((at[8 + lane / 8] >> (lane % 8)) & 1) << 4;
}

// The same from the int8 activations' layout ([panels, blocks, chunks, 64], blockmm_int8.cpp).
int code_int8_layout(const uint8_t *codes, int bits, int64_t p, int64_t nb, int64_t i, int64_t lane) {
    const int64_t b = i / GROUP, in = i % GROUP;
    const int64_t chunks = bits == 4 ? 4 : bits == 5 ? 5 : 8;
    const uint8_t *block = codes + (p * nb + b) * chunks * 64;
    if (bits == 8) return block[in / 4 * 64 + lane * 4 + in % 4];
    const int64_t half = in / 16, g = in % 16 / 4, j = in % 4;
    const int byte = block[g * 64 + lane * 4 + j];
    const int low = half ? byte >> 4 : byte & 0x0F;
    if (bits == 4) return low;
    const int mask = block[4 * 64 + g * 16 + half * 8 + lane / 2];
    return low | ((mask >> (4 * (lane % 2) + j)) & 1) << 4;
}

}  // namespace

// out[r, :] = row index[r] of the [n, k] matrix (codes, d, m); 0, -1 when an index is outside
// [0, n) (nothing written), or -2 for a format it does not know (the caller's bug).
extern "C" int block_rows(const int64_t *index, int64_t t, int64_t n, int64_t k, int bits, int scale_format,
                          int int8_layout, const uint8_t *codes, const void *d, const void *m, float *out) {
    if ((bits != 4 && bits != 5 && bits != 8) || scale_format < 0 || scale_format > 2) return -2;
    for (int64_t r = 0; r < t; r++)
        if (index[r] < 0 || index[r] >= n) return -1;
    const int64_t nb = k / GROUP;
    for (int64_t r = 0; r < t; r++) {
        const int64_t p = index[r] / PANEL, lane = index[r] % PANEL;
        float *row = out + r * k;
        for (int64_t b = 0; b < nb; b++) {
            const float scale = block_value(d, scale_format, p, nb, b, lane);
            const float offset = block_value(m, scale_format, p, nb, b, lane);
            for (int64_t i = b * GROUP; i < (b + 1) * GROUP; i++) {
                const int code = int8_layout ? code_int8_layout(codes, bits, p, nb, i, lane)
                                             : code_float_layout(codes, bits, p, k, i, lane);
                row[i] = static_cast<float>(code) * scale + offset;
            }
        }
    }
    return 0;
}
