/* The hybrid model's CPU forward in C: tree verification, publication, logits rows and the MTP draft
 * step of one request, single-threaded, with bfloat16 weights and float32 arithmetic (activations,
 * accumulators, the recurrent state and the KV cache are float32).
 *
 * Row invariance (why AR, chain and tree give bitwise the same rows): every value a row produces is
 * computed by the same instructions in the same order whatever the other rows are.
 *  - GEMM: each output element is one FMA chain over k = 0..K-1 starting from 0, whatever the tile.
 *  - GDN: each node's state is made from its parent's state by one recurrent step (decay first,
 *    predict, rank-1 write, read), exactly the step an autoregressive decode takes; publication
 *    replays the accepted nodes with the recorded operands through the same step function.
 *  - Attention: a row's keys are visited in position order (committed prefix, then its ancestors by
 *    depth, then itself), scores, max, exponential sums and the value sum each in that one order; a
 *    token decoded later sees the same keys at the same indices.
 *  - Norms, RoPE, conv, gates: per row, fixed order.
 * Built with -ffp-contract=off: the compiler never fuses a multiply and an add by itself; FMAs are
 * explicit (vfma) and the same in every caller.
 *
 * One implementation for every ISA path: vectors are GCC vector types of the machine's register
 * width (VL floats: 16 with AVX-512, 8 with AVX2, 4 with NEON; wider types live in memory on a
 * narrower machine, which made the AVX2 build 3-6x slower), and only vfma, the weight unpack and
 * the GEMM's register tiles differ per ISA. Sums across lanes (hsum, the GDN reductions, softmax)
 * follow the lane count, so the paths agree within float32 rounding, not bit for bit; GEMM outputs
 * and attention scores are single FMA chains and agree exactly.
 *
 * Layouts: weights packed by lt_pack_bf16 into [N/16][K][16] bfloat16 panels (N padded to 16), each
 * panel row's 16 values stored in the order 0, 8, 1, 9, ..., 7, 15 (so a 32-bit lane holds columns
 * j and j + 8: a shift and a mask unpack them, see vload_bf16x16);
 * GDN recurrent state [HV, V, K]; conv state [C, W-1] oldest first; KV cache [T, Hkv, D] token-major.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* The ISA paths differ only in the small kernels below (vfma, the GEMM's register tile and its
 * weight unpack); everything else is plain C over GCC vector types, compiled for each. */
#if defined(__AVX512F__)
#include <immintrin.h>
#define LT_ISA "avx512"
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define LT_ISA "avx2"
#elif defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#define LT_ISA "neon"
#else
#error "the native CPU forward needs AVX2+FMA, AVX-512 or ARM64 NEON"
#endif

/* the kernel path this library was built for: avx512, avx2 or neon */
const char* lt_isa(void) { return LT_ISA; }

/* ---- VL-lane float vectors ------------------------------------------------------------------ */
#if defined(__AVX512F__)
#define VL 16
#elif defined(__AVX2__)
#define VL 8
#else
#define VL 4
#endif
#define VB (16 / VL) /* vectors per 16-float block: a panel row, a key block's head chunk */
typedef float vf __attribute__((vector_size(VL * 4)));
typedef int32_t vi __attribute__((vector_size(VL * 4)));
typedef uint32_t vu __attribute__((vector_size(VL * 4)));

static inline vf vload(const float* p) { vf v; memcpy(&v, p, sizeof v); return v; }
static inline void vstore(float* p, vf v) { memcpy(p, &v, sizeof v); }
static inline vf vset1(float x) {
#if defined(__AVX512F__)
    return (vf)_mm512_set1_ps(x);
#elif defined(__AVX2__)
    return (vf)_mm256_set1_ps(x);
#else
    return (vf)vdupq_n_f32(x);
#endif
}
static inline vf vzero(void) { return (vf){}; }

static inline vf vfma(vf a, vf b, vf c) { /* a * b + c, one rounding */
#if defined(__AVX512F__)
    return (vf)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(__AVX2__)
    return (vf)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
    return (vf)vfmaq_f32((float32x4_t)c, (float32x4_t)a, (float32x4_t)b);
#endif
}

/* A panel row (16 bfloat16 in the packed order) -> out[VB]. With AVX-512 one zero-extension keeps
 * the packed lane order (columns 0, 8, 1, 9, ...; vstore16 puts them in place once per tile); the
 * narrower paths split each 32-bit lane: << 16 gives column j, & 0xffff0000 column j + 8. */
static inline void vload_bf16x16(const uint16_t* p, vf* out) {
#if defined(__AVX512F__)
    __m256i h;
    memcpy(&h, p, sizeof h);
    out[0] = (vf)_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16);
#else
    for (int i = 0; i < VB / 2; i++) {
        vu w;
        memcpy(&w, p + i * 2 * VL, sizeof w);
        out[i] = (vf)(w << 16);
        out[i + VB / 2] = (vf)(w & 0xffff0000u);
    }
#endif
}

/* 16 GEMM outputs of one row (vectors as vload_bf16x16 makes them) -> y[0..16) in column order */
static inline void vstore16(float* y, const vf* acc) {
#if defined(__AVX512F__)
    vstore(y, __builtin_shufflevector(acc[0], acc[0], 0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15));
#else
    for (int i = 0; i < VB; i++) vstore(y + i * VL, acc[i]);
#endif
}

static inline float hsum(vf v) { /* fixed pairwise order: halves, quarters, ... */
    float t[VL];
    memcpy(t, &v, sizeof t);
    for (int w = VL / 2; w >= 1; w /= 2)
        for (int i = 0; i < w; i++) t[i] = t[i] + t[i + w];
    return t[0];
}

static inline float hmax(vf v) {
    float m = v[0];
    for (int i = 1; i < VL; i++) m = v[i] > m ? v[i] : m;
    return m;
}
static inline vf vselect(vi mask, vf a, vf b) { return (vf)((mask & (vi)a) | (~mask & (vi)b)); }
static inline vf vmax(vf a, vf b) { return vselect(a > b, a, b); }

/* exp(x), vectorised (Cody-Waite reduction, degree-6 polynomial, ~1 ulp); exp(x < -103.97) = 0 */
static inline vf vexp(vf x) {
    const vf hi = vset1(88.3762626647949f), lo = vset1(-103.972084f), magic = vset1(12582912.0f);
    vi under = x < lo;
    vf xc = vselect(x > hi, hi, vselect(under, lo, x));
    vf k = (xc * vset1(1.44269504088896341f) + magic) - magic; /* round to nearest */
    vf r = vfma(k, vset1(-0.693359375f), xc);
    r = vfma(k, vset1(2.12194440e-4f), r);
    vf p = vset1(1.9875691500e-4f);
    p = vfma(p, r, vset1(1.3981999507e-3f));
    p = vfma(p, r, vset1(8.3334519073e-3f));
    p = vfma(p, r, vset1(4.1665795894e-2f));
    p = vfma(p, r, vset1(1.6666665459e-1f));
    p = vfma(p, r, vset1(5.0000001201e-1f));
    p = vfma(p, r * r, r + vset1(1.0f));
    /* 2^k in two factors: k reaches -150 after the clamp, below the normal range of one factor */
    vi ki = __builtin_convertvector(k, vi);
    vi k1 = ki / 2, k2 = ki - k1;
    vi b1 = (k1 + 127) << 23, b2 = (k2 + 127) << 23;
    vf out = (p * (vf)b1) * (vf)b2;
    return (vf)((vi)out & ~under);
}

/* silu over n floats in place or out of place: y = x / (1 + exp(-x)) */
static void silu_n(const float* x, float* y, int n) {
    int j = 0;
    for (; j + VL <= n; j += VL) {
        vf v = vload(x + j);
        vstore(y + j, v / (vset1(1.0f) + vexp(-v)));
    }
    for (; j < n; j++) y[j] = x[j] / (1.0f + expf(-x[j]));
}

static inline float sigmoid1(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline float softplus1(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* ---- GEMM: y[m, n] = sum_k x[m, k] w[n, k] --------------------------------------------------- */
void lt_pack_bf16(const uint16_t* w, int32_t n, int32_t k, int32_t n_pad, uint16_t* out) {
    /* w [n, k] row-major -> panels [n_pad/16][k][16] in the packed order; rows n..n_pad-1 are zero */
    for (int b = 0; b < n_pad / 16; b++)
        for (int kk = 0; kk < k; kk++)
            for (int j = 0; j < 16; j++) {
                int row = b * 16 + j, at = j < 8 ? 2 * j : 2 * (j - 8) + 1;
                out[((int64_t)b * k + kk) * 16 + at] = row < n ? w[(int64_t)row * k + kk] : 0;
            }
}

#define GEMM_TILE(MR, NB)                                                                            \
    static void tile_##MR##x##NB(const float* x, int ldx, int k, const uint16_t* w, int64_t panel,  \
                                 float* y, int ldy) {                                                \
        vf acc[MR][NB * VB];                                                                         \
        for (int m = 0; m < MR; m++)                                                                 \
            for (int j = 0; j < NB * VB; j++) acc[m][j] = vzero();                                   \
        for (int kk = 0; kk < k; kk++) {                                                             \
            vf wv[NB * VB];                                                                          \
            for (int b = 0; b < NB; b++) vload_bf16x16(w + b * panel + (int64_t)kk * 16, wv + b * VB); \
            for (int m = 0; m < MR; m++) {                                                           \
                vf xv = vset1(x[(int64_t)m * ldx + kk]);                                             \
                for (int j = 0; j < NB * VB; j++) acc[m][j] = vfma(xv, wv[j], acc[m][j]);            \
            }                                                                                        \
        }                                                                                            \
        for (int m = 0; m < MR; m++)                                                                 \
            for (int b = 0; b < NB; b++) vstore16(y + (int64_t)m * ldy + b * 16, acc[m] + b * VB);   \
    }
typedef void (*tile_fn)(const float*, int, int, const uint16_t*, int64_t, float*, int);
/* Register tiles (rows x panels) per row count: accumulators + one panel row of weights + the
 * broadcast fit the register file (32 vectors with AVX-512 and NEON, 16 with AVX2). */
#define MR_MAX 6
#define GROUP 4 /* panels a column group spans: its weights stay in cache while every row block passes */
GEMM_TILE(1, 1) GEMM_TILE(2, 1) GEMM_TILE(3, 1) GEMM_TILE(4, 1) GEMM_TILE(5, 1) GEMM_TILE(6, 1)
static const tile_fn TILE_ONE[7] = {0, tile_1x1, tile_2x1, tile_3x1, tile_4x1, tile_5x1, tile_6x1};
#if defined(__AVX512F__) /* a panel is 1 vector: 6 x 4 tiles */
GEMM_TILE(1, 4) GEMM_TILE(2, 4) GEMM_TILE(3, 4) GEMM_TILE(4, 4) GEMM_TILE(5, 4) GEMM_TILE(6, 4)
static const tile_fn TILE_WIDE[7] = {0, tile_1x4, tile_2x4, tile_3x4, tile_4x4, tile_5x4, tile_6x4};
static const int NB_WIDE[7] = {0, 4, 4, 4, 4, 4, 4};
#elif defined(__AVX2__) /* a panel is 2 vectors of 16 registers: 1 x 4, 2 x 2, then one panel */
GEMM_TILE(1, 4) GEMM_TILE(2, 2)
static const tile_fn TILE_WIDE[7] = {0, tile_1x4, tile_2x2, tile_3x1, tile_4x1, tile_5x1, tile_6x1};
static const int NB_WIDE[7] = {0, 4, 2, 1, 1, 1, 1};
#else /* NEON: a panel is 4 vectors of 32 registers: 1 x 4, 2 x 2, then one panel */
GEMM_TILE(1, 4) GEMM_TILE(2, 2)
static const tile_fn TILE_WIDE[7] = {0, tile_1x4, tile_2x2, tile_3x1, tile_4x1, tile_5x1, tile_6x1};
static const int NB_WIDE[7] = {0, 4, 2, 1, 1, 1, 1};
#endif

/* x [m, k] (row stride ldx), w packed [n_pad/16][k][16], y [m, n_pad] (row stride ldy >= n_pad) */
void lt_gemm(const float* x, int32_t m, int32_t ldx, int32_t k, const uint16_t* w, int32_t n_pad, float* y,
             int32_t ldy) {
    int64_t panel = (int64_t)k * 16;
    int blocks = n_pad / 16;
    for (int b0 = 0; b0 < blocks; b0 += GROUP) {
        int b1 = b0 + GROUP < blocks ? b0 + GROUP : blocks;
        for (int m0 = 0; m0 < m; m0 += MR_MAX) {
            int mr = m - m0 < MR_MAX ? m - m0 : MR_MAX, nb = NB_WIDE[mr];
            const float* xr = x + (int64_t)m0 * ldx;
            float* yr = y + (int64_t)m0 * ldy;
            int b = b0;
            for (; b + nb <= b1; b += nb) TILE_WIDE[mr](xr, ldx, k, w + b * panel, panel, yr + b * 16, ldy);
            for (; b < b1; b++) TILE_ONE[mr](xr, ldx, k, w + b * panel, panel, yr + b * 16, ldy);
        }
    }
}

#define QCHUNK 64 /* queries attended together (attention) */

/* ---- the model ------------------------------------------------------------------------------- */
typedef struct {
    int32_t n_pad, k;
    const uint16_t* w;
} Linear;

typedef struct {
    int32_t is_gdn;
    const float* in_norm;   /* [H]: 1 + w of the zero-centred RMSNorm */
    const float* post_norm; /* [H] */
    Linear proj;            /* GDN: [qkv | z | b | a]; attention: [q+gate | k | v] */
    Linear out;             /* GDN out_proj / attention o_proj */
    Linear gate_up;         /* MLP [gate | up] */
    Linear down;
    /* GDN */
    const float* conv_w;  /* [C, W] */
    const float* neg_a;   /* -exp(A_log) [HV] */
    const float* dt_bias; /* [HV] */
    const float* gnorm;   /* [V] gated-norm weight */
    float* recurrent;     /* [HV, V, K] durable */
    float* conv_state;    /* [C, W-1] durable */
    float* rec_x;         /* [R, C] pre-conv inputs of the last verification */
    float* rec_u;         /* [R, HV, V] rank-1 write vectors */
    float* rec_eg;        /* [R, HV] exp(g) */
    float* rec_k;         /* [R, H, K] normalised keys */
    /* attention */
    const float* q_norm; /* [D]: 1 + w */
    const float* k_norm; /* [D] */
    float* k_cache;      /* [T, Hkv, D] */
    float* v_cache;
} Layer;

typedef struct {
    int32_t hidden, inter, vocab, n_layers, max_rows;
    int32_t hk, hv, dk, dv, conv_dim, conv_w;
    int32_t hq, hkv, hd, rot;
    float eps;
    int64_t kv_capacity;
    const float* inv_freq;   /* [rot / 2] */
    const uint16_t* embed;   /* [vocab, H] bfloat16 row-major */
    const float* final_norm; /* [H]: 1 + w */
    Linear lm_head;
    Layer* layers;
    float* work;   /* lt_work_floats(model) floats */
    float* states; /* [R, HV, V, K] node states of the GDN layer being verified */
    /* MTP module (layers of a single full-attention decoder layer) */
    const float* mtp_norm_e; /* [H] */
    const float* mtp_norm_h;
    const float* mtp_norm; /* [H] final */
    Linear mtp_fc;         /* [H, 2H] */
    Layer* mtp_layer;
    /* draft vocabulary of the MTP proposals (draft_n == 0: the whole vocabulary) */
    Linear draft_head;        /* [draft_n, H]: the vocabulary projection's rows of draft_ids */
    const int64_t* draft_ids; /* [draft_n] token ids, ascending */
    int32_t draft_n;
} Model;

/* the rows one forward runs: logical rows 0..n-1 (parents first) */
typedef struct {
    int32_t n;
    int64_t prefix;             /* committed keys every row sees */
    const int64_t* row_prefix;  /* [n] per-row prefix instead (a chain: start + row), or NULL */
    const int64_t* pos;         /* [n] positions */
    const int64_t* depth;  /* [n] */
    const int64_t* slot;   /* [n] physical slot: KV row prefix + slot */
    const int64_t* anc;    /* [n, anc_stride] logical ancestor at each depth */
    int32_t anc_stride;
} Rows;

/* rows of a caller's flat token tensors the plugin's GDN entry points read and write (see lt_gdn_tree) */
typedef struct {
    const void* x;
    const void* a;
    const void* b;
    void* o;
    int64_t ldx, lda, ldb, ldo; /* row strides in elements */
    int32_t bf16;
} GdnIO;

/* a request's paged KV cache of one attention layer, in the layout of vLLM's CPU attention ("vec":
 * per block and KV head, 2 B D values: keys dimension-major [D][B], then values token-major [B][D]),
 * float32 or bfloat16, and the step's query and output rows [.., HQ, D] (see lt_paged_tree_attention) */
typedef struct {
    const void* cache;     /* [blocks, HKV, B, 2 D] */
    const int32_t* blocks; /* the request's block table: position t in block blocks[t / B] */
    int32_t block_size;
    const void* q;
    void* o;
    int64_t ldq, ldo; /* row strides in elements */
    int32_t bf16;
} PagedIO;

static inline int64_t ancestor(const Rows* r, int i, int d) { return r->anc[(int64_t)i * r->anc_stride + d]; }
static inline int64_t prefix_of(const Rows* r, int i) { return r->row_prefix ? r->row_prefix[i] : r->prefix; }

/* The layout of the structures above, for the check of their ctypes mirror (model.py): "Struct" ->
 * sizeof, "Struct.field" -> offsetof, ending with a NULL name. Every field is listed, so a field
 * added here and not in the mirror (or moved, or resized) makes model.layout_mismatches name it. */
typedef struct {
    const char* name;
    int64_t value;
} LtLayout;

#define LT_SIZE(S) {#S, (int64_t)sizeof(S)}
#define LT_AT(S, f) {#S "." #f, (int64_t)offsetof(S, f)}

static const LtLayout LT_LAYOUT[] = {
    LT_SIZE(Linear), LT_AT(Linear, n_pad), LT_AT(Linear, k), LT_AT(Linear, w),

    LT_SIZE(Layer), LT_AT(Layer, is_gdn), LT_AT(Layer, in_norm), LT_AT(Layer, post_norm),
    LT_AT(Layer, proj), LT_AT(Layer, out), LT_AT(Layer, gate_up), LT_AT(Layer, down),
    LT_AT(Layer, conv_w), LT_AT(Layer, neg_a), LT_AT(Layer, dt_bias), LT_AT(Layer, gnorm),
    LT_AT(Layer, recurrent), LT_AT(Layer, conv_state), LT_AT(Layer, rec_x), LT_AT(Layer, rec_u),
    LT_AT(Layer, rec_eg), LT_AT(Layer, rec_k), LT_AT(Layer, q_norm), LT_AT(Layer, k_norm),
    LT_AT(Layer, k_cache), LT_AT(Layer, v_cache),

    LT_SIZE(Model), LT_AT(Model, hidden), LT_AT(Model, inter), LT_AT(Model, vocab),
    LT_AT(Model, n_layers), LT_AT(Model, max_rows), LT_AT(Model, hk), LT_AT(Model, hv),
    LT_AT(Model, dk), LT_AT(Model, dv), LT_AT(Model, conv_dim), LT_AT(Model, conv_w),
    LT_AT(Model, hq), LT_AT(Model, hkv), LT_AT(Model, hd), LT_AT(Model, rot), LT_AT(Model, eps),
    LT_AT(Model, kv_capacity), LT_AT(Model, inv_freq), LT_AT(Model, embed), LT_AT(Model, final_norm),
    LT_AT(Model, lm_head), LT_AT(Model, layers), LT_AT(Model, work), LT_AT(Model, states),
    LT_AT(Model, mtp_norm_e), LT_AT(Model, mtp_norm_h), LT_AT(Model, mtp_norm), LT_AT(Model, mtp_fc),
    LT_AT(Model, mtp_layer), LT_AT(Model, draft_head), LT_AT(Model, draft_ids), LT_AT(Model, draft_n),

    LT_SIZE(GdnIO), LT_AT(GdnIO, x), LT_AT(GdnIO, a), LT_AT(GdnIO, b), LT_AT(GdnIO, o), LT_AT(GdnIO, ldx),
    LT_AT(GdnIO, lda), LT_AT(GdnIO, ldb), LT_AT(GdnIO, ldo), LT_AT(GdnIO, bf16),

    LT_SIZE(PagedIO), LT_AT(PagedIO, cache), LT_AT(PagedIO, blocks), LT_AT(PagedIO, block_size),
    LT_AT(PagedIO, q), LT_AT(PagedIO, o), LT_AT(PagedIO, ldq), LT_AT(PagedIO, ldo), LT_AT(PagedIO, bf16),

    LT_SIZE(Rows), LT_AT(Rows, n), LT_AT(Rows, prefix), LT_AT(Rows, row_prefix), LT_AT(Rows, pos),
    LT_AT(Rows, depth), LT_AT(Rows, slot), LT_AT(Rows, anc), LT_AT(Rows, anc_stride),
    {NULL, 0},
};

const LtLayout* lt_layout(void) { return LT_LAYOUT; }

/* floats of attention's work buffer over up to `keys` keys (attend_rows) */
int64_t lt_attn_work_floats(int64_t keys) {
    int64_t lds = keys + 16;
    return 2 * (int64_t)QCHUNK * 256 + 2 * lds + (int64_t)QCHUNK * lds + 64;
}

/* floats of the work buffer for `rows` rows, widest projection `wide`, mixer width `mix`, `keys` keys */
int64_t lt_work_floats(int32_t rows, int32_t hidden, int32_t wide, int32_t inter, int32_t mix, int64_t keys) {
    int64_t per_row = 2 * (int64_t)hidden + wide + mix + inter + mix;
    return (int64_t)rows * per_row + lt_attn_work_floats(keys);
}

static void rms_norm(const float* x, const float* w1, int n, float eps, float* y) {
    vf acc = vzero();
    int i = 0;
    for (; i + VL <= n; i += VL) {
        vf v = vload(x + i);
        acc = vfma(v, v, acc);
    }
    float ss = hsum(acc);
    for (; i < n; i++) ss = fmaf(x[i], x[i], ss);
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int j = 0; j < n; j++) y[j] = (x[j] * r) * w1[j];
}

static float dot(const float* a, const float* b, int n) { /* n a multiple of 16 */
    vf acc = vload(a) * vload(b);
    for (int i = VL; i < n; i += VL) acc = vfma(vload(a + i), vload(b + i), acc);
    return hsum(acc);
}

static void rope(float* x, int64_t pos, const float* inv_freq, int rot) {
    int half = rot / 2;
    float tmp[256];
    for (int i = 0; i < rot; i++) {
        float f = (float)pos * inv_freq[i % half];
        float c = cosf(f), s = sinf(f);
        float rotated = i < half ? -x[i + half] : x[i - half];
        tmp[i] = x[i] * c + rotated * s;
    }
    memcpy(x, tmp, (size_t)rot * sizeof(float));
}

static void mlp(const Model* m, const Layer* L, const Rows* r, float* h, float* xn, float* gu, float* act,
                float* tmp) {
    int H = m->hidden, I = m->inter;
    for (int i = 0; i < r->n; i++) rms_norm(h + (int64_t)i * H, L->post_norm, H, m->eps, xn + (int64_t)i * H);
    lt_gemm(xn, r->n, H, H, L->gate_up.w, L->gate_up.n_pad, gu, L->gate_up.n_pad);
    for (int i = 0; i < r->n; i++) {
        const float* g = gu + (int64_t)i * L->gate_up.n_pad;
        float* a = act + (int64_t)i * I;
        silu_n(g, a, I);
        for (int j = 0; j < I; j++) a[j] = a[j] * g[I + j];
    }
    lt_gemm(act, r->n, I, I, L->down.w, L->down.n_pad, tmp, L->down.n_pad);
    for (int i = 0; i < r->n; i++)
        for (int j = 0; j < H; j++) h[(int64_t)i * H + j] += tmp[(int64_t)i * L->down.n_pad + j];
}

/* Butterfly stage over VL vectors: combine vector i with i + b lane-block by lane-block. Used as a
 * swap it transposes a VL x VL block; used with an add it sums VL vectors' lanes at once. LOb / HIb
 * take, from each 2b-lane group of x then y, the low (high) b lanes. */
#define UNPAREN(...) __VA_ARGS__
#define SHUF(x, y, idx) __builtin_shufflevector(x, y, UNPAREN idx)
#if VL == 16
#define LO8 (0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23)
#define HI8 (8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31)
#define LO4 (0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27)
#define HI4 (4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31)
#define LO2 (0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29)
#define HI2 (2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31)
#define LO1 (0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30)
#define HI1 (1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31)
#define STAGES(OP) OP(8, LO8, HI8) OP(4, LO4, HI4) OP(2, LO2, HI2) OP(1, LO1, HI1) /* widest first */
#elif VL == 8
#define LO4 (0, 1, 2, 3, 8, 9, 10, 11)
#define HI4 (4, 5, 6, 7, 12, 13, 14, 15)
#define LO2 (0, 1, 8, 9, 4, 5, 12, 13)
#define HI2 (2, 3, 10, 11, 6, 7, 14, 15)
#define LO1 (0, 8, 2, 10, 4, 12, 6, 14)
#define HI1 (1, 9, 3, 11, 5, 13, 7, 15)
#define STAGES(OP) OP(4, LO4, HI4) OP(2, LO2, HI2) OP(1, LO1, HI1)
#else
#define LO2 (0, 1, 4, 5)
#define HI2 (2, 3, 6, 7)
#define LO1 (0, 4, 2, 6)
#define HI1 (1, 5, 3, 7)
#define STAGES(OP) OP(2, LO2, HI2) OP(1, LO1, HI1)
#endif

/* out lane i = the sum of v[i]'s VL lanes (a fixed order); v is clobbered */
static inline vf reduce_lanes(vf v[VL]) {
#define ADD(b, lo, hi) \
    for (int i = 0; i < (b); i++) v[i] = SHUF(v[i], v[i + (b)], lo) + SHUF(v[i], v[i + (b)], hi);
    STAGES(ADD)
#undef ADD
    return v[0];
}

/* VL x VL transpose in place */
static inline void transpose_lanes(vf v[VL]) {
#define SWAP(b, lo, hi)                                                                             \
    for (int i = 0; i < VL; i++)                                                                    \
        if (!(i & (b))) {                                                                           \
            vf x = v[i], y = v[i + (b)];                                                            \
            v[i] = SHUF(x, y, lo);                                                                  \
            v[i + (b)] = SHUF(x, y, hi);                                                            \
        }
    STAGES(SWAP)
#undef SWAP
}

/* One recurrent step of a value head: s_out = s_in * eg + u k^T with u = beta (v - (s_in eg) k), and
 * o = s_out q; u_out gets u. s_in, s_out [V, VL nc], V a multiple of 16. Value rows go VL at a time
 * so their dot products reduce together (reduce_lanes). */
static inline __attribute__((always_inline)) void gdn_step(const float* s_in, float* s_out, float eg, float beta,
                                                          const float* v, const float* k, const float* q, int V,
                                                          const int nc, float* u_out, float* o) {
    int K = nc * VL;
    vf kv[256 / VL], qv[256 / VL], egv = vset1(eg), acc[VL];
    for (int c = 0; c < nc; c++) {
        kv[c] = vload(k + c * VL);
        qv[c] = vload(q + c * VL);
    }
    for (int v0 = 0; v0 < V; v0 += VL) {
        for (int r = 0; r < VL; r++) {
            const float* si = s_in + (int64_t)(v0 + r) * K;
            float* so = s_out + (int64_t)(v0 + r) * K;
            vf a = vzero();
            for (int c = 0; c < nc; c++) {
                vf t = vload(si + c * VL) * egv;
                vstore(so + c * VL, t);
                a = vfma(t, kv[c], a);
            }
            acc[r] = a;
        }
        vf u = vset1(beta) * (vload(v + v0) - reduce_lanes(acc));
        vstore(u_out + v0, u);
        for (int r = 0; r < VL; r++) {
            float* so = s_out + (int64_t)(v0 + r) * K;
            vf ur = vset1(u[r]), a = vzero();
            for (int c = 0; c < nc; c++) {
                vf sn = vfma(ur, kv[c], vload(so + c * VL));
                vstore(so + c * VL, sn);
                a = vfma(sn, qv[c], a);
            }
            acc[r] = a;
        }
        vstore(o + v0, reduce_lanes(acc));
    }
}

static void gdn_step_head(const float* s_in, float* s_out, float eg, float beta, const float* v, const float* k,
                          const float* q, int V, int K, float* u_out, float* o) {
    switch (K) { /* constant trip counts keep the key vectors in registers */
    case 64: gdn_step(s_in, s_out, eg, beta, v, k, q, V, 64 / VL, u_out, o); break;
    case 128: gdn_step(s_in, s_out, eg, beta, v, k, q, V, 128 / VL, u_out, o); break;
    default: gdn_step(s_in, s_out, eg, beta, v, k, q, V, K / VL, u_out, o);
    }
}

/* the publication step of a value head: s = s * eg + u k^T (the same arithmetic as gdn_step_head) */
static void gdn_replay_head(float* s, float eg, const float* u, const float* k, int V, int K) {
    vf egv = vset1(eg);
    for (int vv = 0; vv < V; vv++) {
        float* row = s + (int64_t)vv * K;
        vf uv = vset1(u[vv]);
        for (int j = 0; j < K; j += VL) vstore(row + j, vfma(uv, vload(k + j), vload(row + j) * egv));
    }
}

/* x rounded to the nearest bfloat16 (ties to even), as torch's .to(torch.bfloat16) rounds */
static inline float round_bf16(float x) {
    uint32_t bits;
    memcpy(&bits, &x, 4);
    bits = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
    memcpy(&x, &bits, 4);
    return x;
}

/* One GDN row i of `r` (rows in logical order, parents first): the conv window along its ancestry
 * (pre-conv inputs in L->rec_x, taps above the root from the committed conv state), SiLU (rounded to
 * bfloat16 when conv_bf16: a bfloat16 model's conv output), q/k L2 norm, the gates a, b [HV], and
 * one recurrent step per value head from the parent's state (the committed state at depth 0) into
 * m->states[i], or in place on L->recurrent when in_place (a chain). Records k, exp(g) and u for
 * publication; o [HV, DV] gets the read. */
static void gdn_row(const Model* m, const Layer* L, const Rows* r, int i, const float* aa, const float* bb,
                    int in_place, int conv_bf16, float* o) {
    int C = m->conv_dim, W = m->conv_w, HK = m->hk, HV = m->hv, DK = m->dk, DV = m->dv;
    int group = HV / HK, kd = HK * DK;
    int64_t state_floats = (int64_t)HV * DV * DK;
    float y[4096];
    int64_t d = r->depth[i];
    /* conv window along the ancestry: taps above the root come from the committed conv state */
    const float* src[16];
    int64_t stride[16];
    for (int t = 0; t < W; t++) {
        int64_t rel = d - (W - 1) + t;
        src[t] = rel < 0 ? L->conv_state + (W - 1) + rel : L->rec_x + ancestor(r, i, (int)rel) * C;
        stride[t] = rel < 0 ? W - 1 : 1;
    }
    for (int c = 0; c < C; c++) {
        float acc = 0.0f;
        for (int t = 0; t < W; t++) acc = acc + L->conv_w[c * W + t] * src[t][c * stride[t]];
        y[c] = acc;
    }
    silu_n(y, y, C);
    if (conv_bf16)
        for (int c = 0; c < C; c++) y[c] = round_bf16(y[c]);
    float* qn = y;      /* [HK, DK] */
    float* kn = y + kd; /* [HK, DK] */
    const float* v = y + 2 * kd;
    float qscale = 1.0f / sqrtf((float)DK);
    for (int h = 0; h < HK; h++) {
        float* q = qn + h * DK;
        float* k = kn + h * DK;
        float rq = 1.0f / sqrtf(dot(q, q, DK) + 1e-6f), rk = 1.0f / sqrtf(dot(k, k, DK) + 1e-6f);
        for (int j = 0; j < DK; j++) {
            q[j] = (q[j] * rq) * qscale;
            k[j] = k[j] * rk;
        }
    }
    memcpy(L->rec_k + (int64_t)i * kd, kn, (size_t)kd * 4);
    int64_t parent = d == 0 ? -1 : ancestor(r, i, (int)d - 1);
    const float* s_in = in_place || parent < 0 ? L->recurrent : m->states + parent * state_floats;
    float* s_out = in_place ? L->recurrent : m->states + (int64_t)i * state_floats;
    for (int h = 0; h < HV; h++) {
        float g = L->neg_a[h] * softplus1(aa[h] + L->dt_bias[h]);
        float eg = expf(g), beta = sigmoid1(bb[h]);
        L->rec_eg[(int64_t)i * HV + h] = eg;
        int kh = h / group;
        gdn_step_head(s_in + (int64_t)h * DV * DK, s_out + (int64_t)h * DV * DK, eg, beta, v + h * DV,
                      kn + kh * DK, qn + kh * DK, DV, DK, L->rec_u + ((int64_t)i * HV + h) * DV, o + h * DV);
    }
}

static void gdn_mixer(const Model* m, const Layer* L, const Rows* r, const float* xn, float* proj, float* mix) {
    int H = m->hidden, C = m->conv_dim, HV = m->hv, DV = m->dv;
    int np = L->proj.n_pad, vd = HV * DV;
    lt_gemm(xn, r->n, H, H, L->proj.w, np, proj, np);
    for (int i = 0; i < r->n; i++) memcpy(L->rec_x + (int64_t)i * C, proj + (int64_t)i * np, (size_t)C * 4);
    for (int i = 0; i < r->n; i++) {
        const float* pr = proj + (int64_t)i * np;
        const float* z = pr + C;
        const float* bb = pr + C + vd;
        const float* aa = pr + C + vd + HV;
        float o[4096];
        gdn_row(m, L, r, i, aa, bb, 0, 0, o);
        /* gated RMSNorm per value head, then out_proj input */
        float* mr = mix + (int64_t)i * vd;
        silu_n(z, mr, vd);
        for (int h = 0; h < HV; h++) {
            const float* oh = o + h * DV;
            float rr = 1.0f / sqrtf(dot(oh, oh, DV) / (float)DV + m->eps);
            for (int j = 0; j < DV; j++) mr[h * DV + j] = (L->gnorm[j] * (oh[j] * rr)) * mr[h * DV + j];
        }
    }
}

/* The conv state [C, W-1] shifted by path[0..len)'s pre-conv inputs (L->rec_x rows), in place */
static void shift_conv(const Model* m, const Layer* L, const int64_t* path, int len) {
    int C = m->conv_dim, W = m->conv_w;
    for (int c = 0; c < C; c++) {
        float hist[64];
        int n = 0;
        for (int t = 0; t < W - 1; t++) hist[n++] = L->conv_state[(int64_t)c * (W - 1) + t];
        for (int p = 0; p < len; p++) hist[n++] = L->rec_x[path[p] * C + c];
        for (int t = 0; t < W - 1; t++) L->conv_state[(int64_t)c * (W - 1) + t] = hist[n - (W - 1) + t];
    }
}

/* Publish path[0..len) (logical nodes, root first) of a GDN layer's last verification in place: the
 * recorded steps replayed into L->recurrent, the conv state shifted by the path's pre-conv inputs. */
static void publish_gdn(const Model* m, const Layer* L, const int64_t* path, int len) {
    int HK = m->hk, HV = m->hv, DK = m->dk, DV = m->dv, group = HV / HK;
    for (int p = 0; p < len; p++) {
        int64_t node = path[p];
        for (int h = 0; h < HV; h++)
            gdn_replay_head(L->recurrent + (int64_t)h * DV * DK, L->rec_eg[node * HV + h],
                            L->rec_u + (node * HV + h) * DV, L->rec_k + (node * HK + h / group) * DK, DV, DK);
    }
    shift_conv(m, L, path, len);
}

/* ---- the GDN core on a caller's state (the vLLM plugin) ---------------------------------------
 * A chain of known tokens, a tree's verification and its publication, for one GDN layer at a time,
 * on the caller's state: L->recurrent [HV, DV, DK] and L->conv_state [C, W-1] float32, L->rec_* the
 * records a tree leaves for its publication. Inputs and outputs are rows of the caller's flat token
 * tensors (GdnIO): pre-conv x [.., C], gates a, b [.., HV], outputs o [.., HV DV], float32 or, with
 * bf16, bfloat16 (then the conv output is rounded to bfloat16, as a bfloat16 model's conv writes it,
 * and outputs are rounded to nearest even). Every row runs gdn_row, the native forward's own. */
static inline float io_get(const void* p, int64_t at, int bf16) {
    if (!bf16) return ((const float*)p)[at];
    uint32_t bits = (uint32_t)((const uint16_t*)p)[at] << 16;
    float x;
    memcpy(&x, &bits, 4);
    return x;
}

static inline void io_put(void* p, int64_t at, float x, int bf16) {
    if (!bf16) {
        ((float*)p)[at] = x;
        return;
    }
    uint32_t bits;
    x = round_bf16(x);
    memcpy(&bits, &x, 4);
    ((uint16_t*)p)[at] = (uint16_t)(bits >> 16);
}

/* io row `row` -> L->rec_x row i (float32) */
static void stage_x(const Model* m, const Layer* L, const GdnIO* io, int i, int64_t row) {
    int C = m->conv_dim;
    for (int c = 0; c < C; c++) L->rec_x[(int64_t)i * C + c] = io_get(io->x, row * io->ldx + c, io->bf16);
}

/* gdn_row of row i, its gates and output at io row `row` */
static void io_row(const Model* m, const Layer* L, const Rows* r, int i, int64_t row, int in_place, const GdnIO* io) {
    int HV = m->hv, vd = HV * m->dv;
    float aa[256], bb[256], o[4096];
    for (int h = 0; h < HV; h++) {
        aa[h] = io_get(io->a, row * io->lda + h, io->bf16);
        bb[h] = io_get(io->b, row * io->ldb + h, io->bf16);
    }
    gdn_row(m, L, r, i, aa, bb, in_place, io->bf16, o);
    for (int j = 0; j < vd; j++) io_put(io->o, row * io->ldo + j, o[j], io->bf16);
}

/* Verify the rows of a tree (logical row i at io row start + r->slot[i]) from the committed state,
 * which is only read; node states in m->states, records in L->rec_* for lt_gdn_publish. */
void lt_gdn_tree(const Model* m, const Layer* L, const Rows* r, const GdnIO* io, int64_t start) {
    for (int i = 0; i < r->n; i++) stage_x(m, L, io, i, start + r->slot[i]); /* windows read ancestors' x */
    for (int i = 0; i < r->n; i++) io_row(m, L, r, i, start + r->slot[i], 0, io);
}

/* n known tokens at io rows start.. from the committed state, which advances in place: blocks of
 * chain->n rows (a chain table: depth i, ancestor at depth d = d) stepped in place, the conv state
 * shifted after each block. */
void lt_gdn_chain(const Model* m, const Layer* L, const Rows* chain, int32_t n, const GdnIO* io, int64_t start) {
    int64_t path[64];
    for (int j = 0; j < chain->n; j++) path[j] = j;
    for (int32_t j0 = 0; j0 < n; j0 += chain->n) {
        Rows block = *chain;
        block.n = n - j0 < chain->n ? n - j0 : chain->n;
        for (int i = 0; i < block.n; i++) stage_x(m, L, io, i, start + j0 + i);
        for (int i = 0; i < block.n; i++) io_row(m, L, &block, i, start + j0 + i, 1, io);
        shift_conv(m, L, path, block.n);
    }
}

/* Publish path[0..len) of the last lt_gdn_tree of each of n_layers layers into their state */
void lt_gdn_publish(const Model* m, const Layer* layers, int32_t n_layers, const int64_t* path, int32_t len) {
    for (int l = 0; l < n_layers; l++) publish_gdn(m, &layers[l], path, len);
}

/* ---- attention -------------------------------------------------------------------------------
 * Scores are computed VL keys at a time: the block's keys are transposed to [D][VL] and each
 * query's VL scores are one FMA chain over d = 0..D-1 (lanes = keys), so a key's score does not
 * depend on the block it sits in. All rows share the committed prefix [0, cp); each row then has
 * its own keys (a chain row's later prefix rows, then its ancestors' tree slots by depth). */
#define QB 8      /* queries per score tile */
#define PB 4      /* queries per value tile */


/* keys[VL] rows (D floats each) -> kt[D] vectors over the VL keys */
static void key_block(const float* const keys[VL], int D, vf* kt) {
    for (int c = 0; c < D / VL; c++) {
        vf t[VL];
        for (int j = 0; j < VL; j++) t[j] = vload(keys[j] + c * VL);
        transpose_lanes(t);
        for (int dd = 0; dd < VL; dd++) kt[c * VL + dd] = t[dd];
    }
}

/* scores [nq][VL] (row stride lds) of queries q [nq_pad][D] (nq_pad a multiple of QB) */
static void block_scores(const vf* kt, int D, const float* q, int nq, float scale, float* s, int64_t lds) {
    for (int g0 = 0; g0 < nq; g0 += QB) {
        const float* qb = q + (int64_t)g0 * D;
        vf acc[QB];
        for (int g = 0; g < QB; g++) acc[g] = vset1(qb[g * D]) * kt[0];
        for (int d = 1; d < D; d++)
            for (int g = 0; g < QB; g++) acc[g] = vfma(vset1(qb[g * D + d]), kt[d], acc[g]);
        int gb = nq - g0 < QB ? nq - g0 : QB;
        for (int g = 0; g < gb; g++) vstore(s + (g0 + g) * lds, acc[g] * vset1(scale));
    }
}

/* scores of queries q against the cache rows rows[0..n) (head kh), written to s[.., 0..n) */
static void key_scores(const float* cache, int HKV, int kh, int D, const int64_t* rows, int64_t first, int64_t n,
                       const float* q, int nq, float scale, float* s, int64_t lds, const float* zero) {
    vf kt[256];
    for (int64_t j0 = 0; j0 < n; j0 += VL) {
        const float* keys[VL];
        for (int j = 0; j < VL; j++) {
            int64_t jj = j0 + j;
            keys[j] = jj >= n ? zero : cache + ((rows ? rows[jj] : first + jj) * HKV + kh) * D;
        }
        key_block(keys, D, kt);
        float tmp[QCHUNK * VL];
        float* dst = s + j0;
        int64_t ld = lds;
        if (j0 + VL > n) { /* a partial block: keep the scores after it intact */
            dst = tmp;
            ld = VL;
        }
        block_scores(kt, D, q, nq, scale, dst, ld);
        if (dst == tmp)
            for (int g = 0; g < nq; g++) memcpy(s + g * lds + j0, tmp + g * VL, (size_t)(n - j0) * 4);
    }
}

#define VALUE_MAX_PB 8
/* value sums acc[g][D] += sum_j p[g][j] v_j over cache rows rows[0..n) (or first..first+n), for
 * pb queries at once with nd = D / VL vectors each; with constant pb and nd the accumulators stay in
 * registers (each lane is one FMA chain over j either way) */
static inline __attribute__((always_inline)) void value_block(const float* cache, int HKV, int kh, int D,
                                                             const int64_t* rows, int64_t first, int64_t n,
                                                             const float* p, int64_t ldp, float* acc_out,
                                                             const int nd, const int pb) {
    vf acc[VALUE_MAX_PB][256 / VL];
    for (int g = 0; g < pb; g++)
        for (int c = 0; c < nd; c++) acc[g][c] = vload(acc_out + (int64_t)g * D + c * VL);
    for (int64_t j = 0; j < n; j++) {
        const float* vrow = cache + ((rows ? rows[j] : first + j) * HKV + kh) * D;
        for (int g = 0; g < pb; g++) {
            vf pj = vset1(p[g * ldp + j]);
            for (int c = 0; c < nd; c++) acc[g][c] = vfma(pj, vload(vrow + c * VL), acc[g][c]);
        }
    }
    for (int g = 0; g < pb; g++)
        for (int c = 0; c < nd; c++) vstore(acc_out + (int64_t)g * D + c * VL, acc[g][c]);
}

static inline __attribute__((always_inline)) void value_blocks(const float* cache, int HKV, int kh, int D,
                                                              const int64_t* rows, int64_t first, int64_t n,
                                                              const float* p, int nq, int64_t ldp,
                                                              float* acc_out, const int nd, const int pb) {
    int g0 = 0;
    for (; g0 + pb <= nq; g0 += pb)
        value_block(cache, HKV, kh, D, rows, first, n, p + g0 * ldp, ldp, acc_out + (int64_t)g0 * D, nd, pb);
    for (; g0 < nq; g0++)
        value_block(cache, HKV, kh, D, rows, first, n, p + g0 * ldp, ldp, acc_out + (int64_t)g0 * D, nd, 1);
}

/* queries per value block: the accumulators fill about three quarters of the register file (AVX2:
 * 16 vectors, AVX-512 and NEON: 32), so each pass over the value rows serves as many queries as fit */
#define VALUE_ACC (VL == 8 ? 12 : 24)
#define VALUE_PB(D) (VALUE_ACC * VL / (D) >= VALUE_MAX_PB ? VALUE_MAX_PB : VALUE_ACC * VL / (D) >= 1 ? VALUE_ACC * VL / (D) : 1)

static void value_sums(const float* cache, int HKV, int kh, int D, const int64_t* rows, int64_t first, int64_t n,
                       const float* p, int nq, int64_t ldp, float* acc_out) {
    switch (D) { /* constant trip counts keep the accumulators in registers */
    case 64: value_blocks(cache, HKV, kh, D, rows, first, n, p, nq, ldp, acc_out, 64 / VL, VALUE_PB(64)); break;
    case 128: value_blocks(cache, HKV, kh, D, rows, first, n, p, nq, ldp, acc_out, 128 / VL, VALUE_PB(128)); break;
    case 256: value_blocks(cache, HKV, kh, D, rows, first, n, p, nq, ldp, acc_out, 256 / VL, 1); break;
    default: value_blocks(cache, HKV, kh, D, rows, first, n, p, nq, ldp, acc_out, D / VL, 1);
    }
}

/* softmax over s[0..nk) in place; returns the sum of the exponentials */
static float softmax_exp(float* s, int64_t nk) {
    vf mx = vset1(-INFINITY);
    int64_t j = 0;
    for (; j + VL <= nk; j += VL) mx = vmax(vload(s + j), mx);
    float best = hmax(mx);
    for (; j < nk; j++) best = s[j] > best ? s[j] : best;
    vf bv = vset1(best), sum = vzero();
    for (j = 0; j + VL <= nk; j += VL) {
        vf e = vexp(vload(s + j) - bv);
        vstore(s + j, e);
        sum = sum + e;
    }
    float total = hsum(sum);
    for (; j < nk; j++) {
        s[j] = expf(s[j] - best);
        total += s[j];
    }
    return total;
}

/* attention of rows [i0, i1) for KV head kh: q [n][HQ][D] normed and rotated; out [n][HQ][D] */
static void attend_chunk(const Model* m, const Layer* L, const Rows* r, int i0, int i1, int kh, const float* q,
                         float* qh, float* acc, float* s, int64_t lds, int64_t* key_rows, float* out) {
    int D = m->hd, HQ = m->hq, HKV = m->hkv, group = HQ / HKV;
    int nq = (i1 - i0) * group, nq_pad = (nq + QB - 1) / QB * QB;
    float scale = 1.0f / sqrtf((float)D);
    static const float zero[256];
    int64_t cp = INT64_MAX;
    for (int i = i0; i < i1; i++) cp = prefix_of(r, i) < cp ? prefix_of(r, i) : cp;
    for (int i = i0; i < i1; i++)
        for (int g = 0; g < group; g++)
            memcpy(qh + (int64_t)((i - i0) * group + g) * D, q + ((int64_t)i * HQ + kh * group + g) * D,
                   (size_t)D * 4);
    memset(qh + (int64_t)nq * D, 0, (size_t)(nq_pad - nq) * D * 4);
    key_scores(L->k_cache, HKV, kh, D, NULL, 0, cp, qh, nq, scale, s, lds, zero);
    memset(acc, 0, (size_t)nq * D * 4);
    for (int i = i0; i < i1; i++) {
        /* this row's own keys: later prefix rows (a chain), then its ancestors' tree slots by depth */
        int64_t pre = prefix_of(r, i), d = r->depth[i], extra = 0;
        for (int64_t j = cp; j < pre; j++) key_rows[extra++] = j;
        for (int64_t t = 0; t <= d; t++) key_rows[extra++] = pre + r->slot[ancestor(r, i, (int)t)];
        float* si = s + (int64_t)(i - i0) * group * lds;
        const float* qi = qh + (int64_t)(i - i0) * group * D;
        float qpad[QB * 256];
        memcpy(qpad, qi, (size_t)group * D * 4);
        memset(qpad + group * D, 0, (size_t)(QB - group) * D * 4);
        key_scores(L->k_cache, HKV, kh, D, key_rows, 0, extra, qpad, group, scale, si + cp, lds, zero);
        float* ai = acc + (int64_t)(i - i0) * group * D;
        float inv[64];
        for (int g = 0; g < group; g++) inv[g] = 1.0f / softmax_exp(si + g * lds, cp + extra);
        value_sums(L->v_cache, HKV, kh, D, NULL, 0, cp, si, group, lds, ai);
        value_sums(L->v_cache, HKV, kh, D, key_rows, 0, extra, si + cp, group, lds, ai);
        for (int g = 0; g < group; g++) {
            float* o = out + ((int64_t)i * HQ + kh * group + g) * D;
            for (int c = 0; c < D; c += VL) vstore(o + c, vload(ai + g * D + c) * vset1(inv[g]));
        }
    }
}

/* Every row of r attends over L's caches (the committed prefix, its ancestors' slots, itself): q
 * [n][HQ][D] normed and rotated -> out [n][HQ][D]; attn_work: lt_attn_work_floats(lds - 16) floats */
static void attend_rows(const Model* m, const Layer* L, const Rows* r, const float* q, float* out,
                        float* attn_work, int64_t lds) {
    int D = m->hd, HKV = m->hkv, group = m->hq / HKV;
    float* qh = attn_work;
    float* acc = qh + (int64_t)QCHUNK * D;
    int64_t* key_rows = (int64_t*)(acc + (int64_t)QCHUNK * D);
    float* s = (float*)(key_rows + lds);
    int rows_per_chunk = QCHUNK / group;
    for (int kh = 0; kh < HKV; kh++)
        for (int i0 = 0; i0 < r->n; i0 += rows_per_chunk) {
            int i1 = i0 + rows_per_chunk < r->n ? i0 + rows_per_chunk : r->n;
            attend_chunk(m, L, r, i0, i1, kh, q, qh, acc, s, lds, key_rows, out);
        }
}

static void attention_mixer(const Model* m, const Layer* L, const Rows* r, const float* xn, float* proj,
                            float* mix, float* q, float* attn_work, int64_t lds) {
    int H = m->hidden, HQ = m->hq, HKV = m->hkv, D = m->hd, np = L->proj.n_pad;
    lt_gemm(xn, r->n, H, H, L->proj.w, np, proj, np);
    for (int i = 0; i < r->n; i++) {
        float* pr = proj + (int64_t)i * np;
        int64_t row = prefix_of(r, i) + r->slot[i];
        float* kc = L->k_cache + row * HKV * D;
        float* vc = L->v_cache + row * HKV * D;
        const float* k = pr + HQ * 2 * D;
        const float* v = k + HKV * D;
        for (int h = 0; h < HKV; h++) {
            rms_norm(k + h * D, L->k_norm, D, m->eps, kc + h * D);
            rope(kc + h * D, r->pos[i], m->inv_freq, m->rot);
            memcpy(vc + h * D, v + h * D, (size_t)D * 4);
        }
        for (int h = 0; h < HQ; h++) {
            float* qo = q + ((int64_t)i * HQ + h) * D;
            rms_norm(pr + h * 2 * D, L->q_norm, D, m->eps, qo);
            rope(qo, r->pos[i], m->inv_freq, m->rot);
        }
    }
    /* every row's KV is in the cache before any row attends (a row reads its ancestors') */
    attend_rows(m, L, r, q, mix, attn_work, lds);
    for (int i = 0; i < r->n; i++) {
        float* pr = proj + (int64_t)i * np;
        float* mr = mix + (int64_t)i * HQ * D;
        for (int h = 0; h < HQ; h++) {
            const float* gate = pr + h * 2 * D + D;
            for (int j = 0; j < D; j += VL) {
                vf gv = vload(gate + j);
                vstore(mr + h * D + j, vload(mr + h * D + j) * (vset1(1.0f) / (vset1(1.0f) + vexp(-gv))));
            }
        }
    }
}

/* The rows of a tree (logical row i at io row start + r->slot[i], queries RoPE'd at their depth
 * positions) attend over a request's paged KV: its positions gathered..r->prefix + r->n - 1 (the
 * tree's own rows at prefix + slot, written by the model's attention) are first copied to float32
 * token-major L->k_cache, L->v_cache, which hold the earlier positions already (a caller's mirror of
 * the committed prefix); then attend_rows, the native forward's attention. q, out: [r->n][HQ][D]
 * float32 scratch; m->work: lt_attn_work_floats(m->kv_capacity) floats. */
void lt_paged_tree_attention(const Model* m, const Layer* L, const Rows* r, const PagedIO* io, int64_t start,
                             int64_t gathered, float* q, float* out) {
    int HQ = m->hq, HKV = m->hkv, D = m->hd, B = io->block_size, bf16 = io->bf16;
    int64_t tokens = r->prefix + r->n;
    for (int64_t t0 = gathered / B * B; t0 < tokens; t0 += B) {
        int64_t blk = io->blocks[t0 / B], t1 = gathered > t0 ? gathered - t0 : 0;
        int64_t nt = tokens - t0 < B ? tokens - t0 : B;
        for (int h = 0; h < HKV; h++) {
            int64_t base = (blk * HKV + h) * 2 * B * D;
            for (int j = 0; j < D; j++)
                for (int64_t t = t1; t < nt; t++)
                    L->k_cache[((t0 + t) * HKV + h) * D + j] = io_get(io->cache, base + j * B + t, bf16);
            for (int64_t t = t1; t < nt; t++)
                for (int j = 0; j < D; j++)
                    L->v_cache[((t0 + t) * HKV + h) * D + j] = io_get(io->cache, base + B * D + t * D + j, bf16);
        }
    }
    for (int i = 0; i < r->n; i++)
        for (int j = 0; j < HQ * D; j++)
            q[(int64_t)i * HQ * D + j] = io_get(io->q, (start + r->slot[i]) * io->ldq + j, bf16);
    attend_rows(m, L, r, q, out, m->work, m->kv_capacity + 16);
    for (int i = 0; i < r->n; i++)
        for (int j = 0; j < HQ * D; j++)
            io_put(io->o, (start + r->slot[i]) * io->ldo + j, out[(int64_t)i * HQ * D + j], bf16);
}

/* one decoder layer over the rows: h += mixer(norm(h)); h += mlp(norm(h)) */
static void decoder_layer(const Model* m, const Layer* L, const Rows* r, float* h, float* w) {
    int H = m->hidden, R = m->max_rows;
    int wide = L->proj.n_pad > L->gate_up.n_pad ? L->proj.n_pad : L->gate_up.n_pad;
    int mixw = m->hq * m->hd > m->hv * m->dv ? m->hq * m->hd : m->hv * m->dv;
    float* xn = w;
    float* tmp = xn + (int64_t)R * H;
    float* proj = tmp + (int64_t)R * H;
    float* mix = proj + (int64_t)R * wide;
    float* act = mix + (int64_t)R * mixw;
    float* q = act + (int64_t)R * m->inter;
    float* attn_work = q + (int64_t)R * m->hq * m->hd;
    for (int i = 0; i < r->n; i++) rms_norm(h + (int64_t)i * H, L->in_norm, H, m->eps, xn + (int64_t)i * H);
    int dmix;
    if (L->is_gdn) {
        gdn_mixer(m, L, r, xn, proj, mix);
        dmix = m->hv * m->dv;
    } else {
        attention_mixer(m, L, r, xn, proj, mix, q, attn_work, m->kv_capacity + 16);
        dmix = m->hq * m->hd;
    }
    lt_gemm(mix, r->n, dmix, dmix, L->out.w, L->out.n_pad, tmp, L->out.n_pad);
    for (int i = 0; i < r->n; i++)
        for (int j = 0; j < H; j++) h[(int64_t)i * H + j] += tmp[(int64_t)i * L->out.n_pad + j];
    mlp(m, L, r, h, xn, proj, act, tmp);
}

static void embed_rows(const Model* m, const int64_t* tokens, int n, float* h) {
    int H = m->hidden;
    for (int i = 0; i < n; i++) {
        const uint16_t* e = m->embed + tokens[i] * H;
        for (int j = 0; j < H; j++) {
            uint32_t bits = (uint32_t)e[j] << 16;
            memcpy(h + (int64_t)i * H + j, &bits, 4);
        }
    }
}

/* Verify the rows of a tree from the committed state: hidden_out [n, H] post-norm rows. Writes the
 * rows' KV at prefix + slot and the GDN records publication replays; durable GDN state untouched. */
void lt_verify(const Model* m, const Rows* r, const int64_t* tokens, float* residual, float* hidden_out) {
    int H = m->hidden;
    embed_rows(m, tokens, r->n, residual);
    for (int l = 0; l < m->n_layers; l++) decoder_layer(m, &m->layers[l], r, residual, m->work);
    for (int i = 0; i < r->n; i++)
        rms_norm(residual + (int64_t)i * H, m->final_norm, H, m->eps, hidden_out + (int64_t)i * H);
}

/* Publish path[0..len) (logical nodes, root first) of the last verification: GDN replay, conv state,
 * KV rows moved to prefix..prefix+len-1 (gathered before any is written). */
void lt_publish(const Model* m, const Rows* r, const int64_t* path, int32_t len, float* kv_tmp) {
    for (int l = 0; l < m->n_layers; l++) {
        Layer* L = &m->layers[l];
        if (L->is_gdn) {
            publish_gdn(m, L, path, len);
        } else {
            int64_t row_floats = (int64_t)m->hkv * m->hd;
            int moved = 0;
            for (int p = 0; p < len; p++) moved |= r->slot[path[p]] != p;
            if (!moved) continue;
            for (int p = 0; p < len; p++) {
                int64_t src = r->prefix + r->slot[path[p]];
                memcpy(kv_tmp + (2 * p) * row_floats, L->k_cache + src * row_floats, (size_t)row_floats * 4);
                memcpy(kv_tmp + (2 * p + 1) * row_floats, L->v_cache + src * row_floats, (size_t)row_floats * 4);
            }
            for (int p = 0; p < len; p++) {
                int64_t dst = r->prefix + p;
                memcpy(L->k_cache + dst * row_floats, kv_tmp + (2 * p) * row_floats, (size_t)row_floats * 4);
                memcpy(L->v_cache + dst * row_floats, kv_tmp + (2 * p + 1) * row_floats, (size_t)row_floats * 4);
            }
        }
    }
}

/* logits [n, vocab_pad] of post-norm hidden rows [n, H] */
void lt_logits(const Model* m, const float* hidden, int32_t n, float* out) {
    lt_gemm(hidden, n, m->hidden, m->hidden, m->lm_head.w, m->lm_head.n_pad, out, m->lm_head.n_pad);
}

/* One MTP pass over chained rows (row_prefix = start + row, depth and slot 0): hidden
 * rows [n, H] of the target (or the MTP's own) and their next tokens -> MTP post-norm hidden [n, H];
 * writes the MTP KV rows prefix..prefix+n-1; logits_out [vocab_pad] of the last row when not NULL. */
void lt_mtp_step(const Model* m, const Rows* r, const float* hidden, const int64_t* tokens, float* residual,
                 float* hidden_out, float* logits_out) {
    int H = m->hidden;
    float* x = m->work; /* [n, 2H] */
    float* e = x + (int64_t)m->max_rows * 2 * H;
    embed_rows(m, tokens, r->n, e);
    for (int i = 0; i < r->n; i++) {
        rms_norm(e + (int64_t)i * H, m->mtp_norm_e, H, m->eps, x + (int64_t)i * 2 * H);
        rms_norm(hidden + (int64_t)i * H, m->mtp_norm_h, H, m->eps, x + (int64_t)i * 2 * H + H);
    }
    lt_gemm(x, r->n, 2 * H, 2 * H, m->mtp_fc.w, m->mtp_fc.n_pad, residual, H);
    decoder_layer(m, m->mtp_layer, r, residual, m->work);
    for (int i = 0; i < r->n; i++)
        rms_norm(residual + (int64_t)i * H, m->mtp_norm, H, m->eps, hidden_out + (int64_t)i * H);
    if (logits_out) lt_logits(m, hidden_out + (int64_t)(r->n - 1) * H, 1, logits_out);
}

/* The k best entries of x[0..n) in stable descending order (values descending, ties by index
 * ascending) into idx[0..k); returns 0, or -1 if x holds a NaN. */
static int ordered_topk(const float* x, int n, int k, int64_t* idx) {
    float best[64];
    int have = 0;
    for (int j = 0; j < n; j++) {
        float v = x[j];
        if (v != v) return -1;
        if (have == k && !(v > best[k - 1])) continue; /* an equal later value ranks after */
        int at = have < k ? have++ : k - 1;
        while (at > 0 && v > best[at - 1]) {
            best[at] = best[at - 1];
            idx[at] = idx[at - 1];
            at--;
        }
        best[at] = v;
        idx[at] = j;
    }
    return 0;
}

/* The ordered top-k token ids of one MTP hidden row [H]: over the whole vocabulary, or over the
 * draft vocabulary's rows with their ranks mapped to token ids (ascending ids keep the tie order).
 * logits: [vocab_pad] scratch. Returns 0, or -1 if a logit is NaN. */
static int rank_draft(const Model* m, const float* h, int k, float* logits, int64_t* topk) {
    if (!m->draft_n) {
        lt_logits(m, h, 1, logits);
        return ordered_topk(logits, m->vocab, k, topk);
    }
    lt_gemm(h, 1, m->hidden, m->hidden, m->draft_head.w, m->draft_head.n_pad, logits, m->draft_head.n_pad);
    if (ordered_topk(logits, m->draft_n, k, topk)) return -1;
    for (int i = 0; i < k; i++) topk[i] = m->draft_ids[topk[i]];
    return 0;
}

/* An MTP proposal: one pass over the n queued true rows at positions start.. (committed), then
 * depth - 1 speculative single rows each fed the previous pass's MTP hidden row and spine token.
 * topk [depth, k]: each depth's ordered top-k; its first entry is the spine token (the lowest-index
 * argmax), from the draft vocabulary when the model has one. rows [n] holds row_prefix tables the
 * caller filled for the first pass (start + i). Returns 0, or -1 if logits held a NaN. The caller
 * rolls the speculative KV rows back. */
int lt_mtp_propose(const Model* m, Rows* r, const float* hidden, const int64_t* tokens, int32_t depth, int32_t k,
                   float* residual, float* hidden_out, float* logits, int64_t* topk) {
    int H = m->hidden;
    lt_mtp_step(m, r, hidden, tokens, residual, hidden_out, NULL);
    const float* h = hidden_out + (int64_t)(r->n - 1) * H;
    if (rank_draft(m, h, k, logits, topk)) return -1;
    int64_t pos = r->row_prefix[r->n - 1];
    float carry[4096];
    for (int s = 1; s < depth; s++) {
        int64_t zero = 0, self = 0;
        pos += 1;
        Rows one = {1, pos, &pos, &pos, &zero, &zero, &self, 1};
        memcpy(carry, h, (size_t)H * 4);
        lt_mtp_step(m, &one, carry, &topk[(int64_t)(s - 1) * k], residual, hidden_out, NULL);
        h = hidden_out;
        if (rank_draft(m, h, k, logits, topk + (int64_t)s * k)) return -1;
    }
    return 0;
}

/* ---- sampling coins --------------------------------------------------------------------------
 * Philox4x32-10 as lumotree.sampling.rng (Triton's tl.philox): key = the 64-bit seed, counter =
 * (token, position lo, position hi, 0); the first output word becomes a float32 in [0, 1) by
 * Triton's rule. Integer arithmetic and one float multiply: bitwise equal to the NumPy version.
 * out[i, j] = the coin of token tokens[i, j] at output position positions[i]. */
void lt_philox_coins(uint64_t seed, const int64_t* positions, const int64_t* tokens, int32_t n, int32_t k,
                     float* out) {
    for (int i = 0; i < n; i++) {
        uint64_t pos = (uint64_t)positions[i];
        for (int j = 0; j < k; j++) {
            uint32_t x0 = (uint32_t)tokens[(int64_t)i * k + j], x1 = (uint32_t)pos, x2 = (uint32_t)(pos >> 32), x3 = 0;
            uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
            for (int r = 0; r < 10; r++) {
                uint64_t pb = (uint64_t)0xCD9E8D57u * x2, pa = (uint64_t)0xD2511F53u * x0;
                x0 = (uint32_t)(pb >> 32) ^ x1 ^ k0;
                x1 = (uint32_t)pb;
                x2 = (uint32_t)(pa >> 32) ^ x3 ^ k1;
                x3 = (uint32_t)pa;
                k0 += 0x9E3779B9u;
                k1 += 0xBB67AE85u;
            }
            int32_t s = (int32_t)x0;
            out[(int64_t)i * k + j] = (float)(s < 0 ? ~s : s) * 4.6566127342e-10f;
        }
    }
}
