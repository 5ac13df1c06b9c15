// The whole Llama layer stack of one forward pass in one call: RMSNorm, the projections on
// blockmm.cpp's block kernel, RoPE, the K/V written to the float16 pool and attention on
// paged_attention.cpp's kernel, SiLU-gated MLP, residuals, the final norm.
//
// Why: on PyTorch a layer is ~20 small ops, each paying the dispatcher, an allocation and, when
// it runs threaded, a parallel region. At one decode row that was ~8 of a ~16 ms step on the
// 2-core AVX2 kind, as much as the matmuls. Here a layer's element-wise work runs in place in
// buffers the caller owns, and only the matmuls and attention open parallel regions.
//
// What the runtime keeps for itself goes through a hook, a Python callback: attention over any
// other KV layout (the request-level cache, the two-tier store), the rows of long prompt chunks
// (SDPA's tiled causal kernel beats per-row attention there), and LoRA deltas after a
// projection. Each is called between two kernels, with the buffers holding that point's values.
//
// Every element-wise step works on a row alone, in a fixed order: a row's result depends on the
// row, its position and its KV, never on the rows beside it (what blockmm.cpp and the attention
// kernel promise too). x86-64 with AVX2, FMA and F16C.
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "kernels.h"


// Layouts shared with ruvllm_candle_like/native_decoder.py (ctypes.Structure, same field order).
struct Projection {
    const uint8_t *codes;  // blockmm.cpp's layout; n a multiple of 16 (no padding), k of 32
    const void *scale;   // in scale_format (kernels.h ScaleFormat), as offset
    const void *offset;
    const float *bias;  // [n] or null
    int64_t n;
    int64_t k;
    int64_t bits;
    int64_t scale_format;
    int64_t int8;  // codes in blockmm_int8.cpp's layout: int8 activations
};

struct Layer {
    const float *ln1;
    const float *ln2;
    Projection qkv;
    Projection o;
    Projection gate_up;
    Projection down;
};

struct Model {
    int64_t num_layers;
    int64_t hidden;
    int64_t heads;
    int64_t kv_heads;
    int64_t head_dim;
    int64_t intermediate;
    double eps;
    const Layer *layers;
    const float *norm;
    const float *cos;  // [positions, head_dim]
    const float *sin;  // [positions, head_dim], first half negated (model.py's RotaryTable)
};

// The caller's buffers, rows x width, row-major. x holds the embeddings on entry and the
// residual stream throughout; y the final normed hidden state on return.
struct Buffers {
    float *x;     // [rows, hidden]
    float *y;     // [rows, hidden]: a norm's output, then a projection's into the residual
    float *qkv;   // [rows, (heads + 2 kv_heads) head_dim]
    float *attn;  // [rows, heads head_dim]
    float *gu;    // [rows, 2 intermediate]
    float *act;   // [rows, intermediate]
};

// Attention on the float16 pool ([slots, 2, kv_heads, head_dim] per layer, K then V of a slot):
// row r's K/V go to write_slots[r]; it attends over lengths[r] slots at slots + starts[r]
// (length 0: through the hook instead).
struct PoolAttention {
    uint16_t *const *pools;  // [num_layers]
    const int64_t *write_slots;
    const int64_t *slots;
    int64_t slot_count;
    const int64_t *starts;
    const int64_t *lengths;
    int64_t hooked_rows;  // rows of length 0
};

// Hook sites. ATTEND: fill attn's rows (all of them without a pool, else those of length 0)
// from qkv; the others: add LoRA deltas to the site's output (input, output): QKV (y, qkv),
// O (attn, y), GATE_UP (y, gu), DOWN (act, y). Returns 0, or nonzero to stop the pass.
enum Site : int64_t { ATTEND = 0, QKV = 1, O = 2, GATE_UP = 3, DOWN = 4 };
typedef int (*Hook)(int64_t layer, int64_t site);

#ifdef RUVLLM_X86
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace {

// Row-wise work goes parallel only where there is enough of it to pay for a parallel region.
constexpr int64_t PARALLEL_ROWS = 32;

// out = x / sqrt(mean(x^2) + eps) * w, each row alone; width a multiple of 8.
void rms_norm(const float *x, const float *w, float *out, int64_t rows, int64_t width, float eps, int threads) {
#pragma omp parallel for num_threads(threads) if (rows >= PARALLEL_ROWS) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * width;
        float *o = out + r * width;
        __m256 acc = _mm256_setzero_ps();
        for (int64_t i = 0; i < width; i += 8) {
            __m256 v = _mm256_loadu_ps(xr + i);
            acc = _mm256_fmadd_ps(v, v, acc);
        }
        const __m256 inv = _mm256_set1_ps(1.0f / sqrtf(ruvllm::hsum8(acc) / static_cast<float>(width) + eps));
        for (int64_t i = 0; i < width; i += 8)
            _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(xr + i), inv), _mm256_loadu_ps(w + i)));
    }
}

void add_bias(float *y, const float *bias, int64_t rows, int64_t n) {
    if (bias == nullptr) return;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < n; i += 8)
            _mm256_storeu_ps(y + r * n + i, _mm256_add_ps(_mm256_loadu_ps(y + r * n + i), _mm256_loadu_ps(bias + i)));
}

void add_into(float *x, const float *y, int64_t count) {
    for (int64_t i = 0; i < count; i += 8)
        _mm256_storeu_ps(x + i, _mm256_add_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
}

// Half-split RoPE on the q and k heads of each row, in place: x cos + roll(x, D/2) sin with the
// sign folded into sin, as model.py's apply_rope (two products, then their sum, each rounded).
void rope(float *qkv, int64_t stride, int64_t rows, int64_t heads, int64_t dim, const int64_t *positions,
          const float *cos_table, const float *sin_table) {
    const int64_t half = dim / 2;
    for (int64_t r = 0; r < rows; r++) {
        const float *c = cos_table + positions[r] * dim, *s = sin_table + positions[r] * dim;
        for (int64_t h = 0; h < heads; h++) {
            float *x = qkv + r * stride + h * dim;
            for (int64_t i = 0; i < half; i += 8) {
                const __m256 lo = _mm256_loadu_ps(x + i), hi = _mm256_loadu_ps(x + half + i);
                _mm256_storeu_ps(x + i, _mm256_add_ps(_mm256_mul_ps(lo, _mm256_loadu_ps(c + i)),
                                                      _mm256_mul_ps(hi, _mm256_loadu_ps(s + i))));
                _mm256_storeu_ps(x + half + i, _mm256_add_ps(_mm256_mul_ps(hi, _mm256_loadu_ps(c + half + i)),
                                                             _mm256_mul_ps(lo, _mm256_loadu_ps(s + half + i))));
            }
        }
    }
}

// Each row's K and V (after q's heads in qkv) into its pool slot, as float16 (round to nearest
// even, as torch's conversion).
void store_kv(const float *qkv, int64_t stride, int64_t rows, int64_t heads, int64_t kv_heads, int64_t dim,
              uint16_t *pool, const int64_t *write_slots) {
    const int64_t width = 2 * kv_heads * dim;
    for (int64_t r = 0; r < rows; r++) {
        const float *src = qkv + r * stride + heads * dim;
        uint16_t *dst = pool + write_slots[r] * width;
        for (int64_t i = 0; i < width; i += 8)
            _mm_storeu_si128(reinterpret_cast<__m128i *>(dst + i),
                             _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
}

// act = silu(gate) * up = gate * up / (1 + e^-gate), gate and up the two halves of each gu row.
void silu_mul(const float *gu, float *act, int64_t rows, int64_t inter, int threads) {
#pragma omp parallel for num_threads(threads) if (rows >= PARALLEL_ROWS) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *g = gu + r * 2 * inter, *u = g + inter;
        float *a = act + r * inter;
        for (int64_t i = 0; i < inter; i += 8) {
            const __m256 gv = _mm256_loadu_ps(g + i);
            const __m256 den = _mm256_add_ps(_mm256_set1_ps(1.0f), ruvllm::exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv)));
            _mm256_storeu_ps(a + i, _mm256_div_ps(_mm256_mul_ps(gv, _mm256_loadu_ps(u + i)), den));
        }
    }
}

}  // namespace
#pragma GCC pop_options
#endif

namespace {

int project(const Projection &p, const float *x, int64_t rows, float *y, int threads) {
    return blockmm(x, rows, p.k, p.n, static_cast<int>(p.bits), static_cast<int>(p.scale_format),
                   static_cast<int>(p.int8), p.codes, p.scale, p.offset, y, threads);
}

}  // namespace

// The layers over ``rows`` rows at ``positions``; ``pool`` null: attention through the hook.
// ``lora``: call the hook after each projection. Returns 0; -1 when memory ran out, -2 when
// unsupported, -3 when an attention row's slots run past slot_count, -4 when the hook failed.
extern "C" int decoder_forward(const Model *m, int64_t rows, const int64_t *positions, const Buffers *b,
                               const PoolAttention *pool, int lora, Hook hook, int threads) {
#ifdef RUVLLM_X86
    const int64_t hidden = m->hidden, heads = m->heads, kv_heads = m->kv_heads, dim = m->head_dim;
    const int64_t qkv_width = (heads + 2 * kv_heads) * dim;
    const float eps = static_cast<float>(m->eps);
    int rc = 0;
#define STEP(call) if ((rc = (call)) != 0) return rc
#define HOOK(layer, site) if (hook((layer), (site)) != 0) return -4
    for (int64_t i = 0; i < m->num_layers; i++) {
        const Layer &layer = m->layers[i];
        rms_norm(b->x, layer.ln1, b->y, rows, hidden, eps, threads);
        STEP(project(layer.qkv, b->y, rows, b->qkv, threads));
        add_bias(b->qkv, layer.qkv.bias, rows, qkv_width);
        if (lora) HOOK(i, QKV);
        rope(b->qkv, qkv_width, rows, heads + kv_heads, dim, positions, m->cos, m->sin);
        if (pool != nullptr) {
            store_kv(b->qkv, qkv_width, rows, heads, kv_heads, dim, pool->pools[i], pool->write_slots);
            STEP(paged_attention_rows(b->qkv, qkv_width, rows, heads, kv_heads, dim, pool->pools[i], pool->slots,
                                      pool->slot_count, pool->starts, pool->lengths, b->attn, threads));
            if (pool->hooked_rows) HOOK(i, ATTEND);
        } else {
            HOOK(i, ATTEND);
        }
        STEP(project(layer.o, b->attn, rows, b->y, threads));
        add_bias(b->y, layer.o.bias, rows, hidden);
        if (lora) HOOK(i, O);
        add_into(b->x, b->y, rows * hidden);
        rms_norm(b->x, layer.ln2, b->y, rows, hidden, eps, threads);
        STEP(project(layer.gate_up, b->y, rows, b->gu, threads));
        add_bias(b->gu, layer.gate_up.bias, rows, 2 * m->intermediate);
        if (lora) HOOK(i, GATE_UP);
        silu_mul(b->gu, b->act, rows, m->intermediate, threads);
        STEP(project(layer.down, b->act, rows, b->y, threads));
        add_bias(b->y, layer.down.bias, rows, hidden);
        if (lora) HOOK(i, DOWN);
        add_into(b->x, b->y, rows * hidden);
    }
#undef STEP
#undef HOOK
    rms_norm(b->x, m->norm, b->y, rows, hidden, eps, threads);
    return 0;
#else
    (void)m; (void)rows; (void)positions; (void)b; (void)pool; (void)lora; (void)hook; (void)threads;
    return -2;
#endif
}
