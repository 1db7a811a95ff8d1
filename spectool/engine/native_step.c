/* The embedded engine's decoder layers in one call: spectool/engine/native_step.py builds this
 * file with the system's C compiler on first use and calls it through ctypes.
 *
 * Why: on CPU at decode sizes, PyTorch's eager operators cost 1-5 us each and a step of the demo
 * target makes about 1,280 of them; the matrix work is a third of the step (issue 27). Here a
 * forward of N rows through every layer is one call: float16 weights ([out, in], converted to
 * float32 in registers with F16C), float32 activations, sums and KV cache, AVX2 + FMA (and
 * AVX-512's 512-bit vectors for products of 3 rows or more and for attention, where the CPU
 * has them).
 *
 * Exactness: every number a row produces is computed by the same sequence of operations
 * whatever N is and whichever rows share the call (each dot product has its own accumulator;
 * rows are blocked, up to two or twelve, only to share weight loads). So a verify pass of k + 1
 * rows gives bit for bit the logits that k + 1 single-row steps give, and greedy speculative
 * decoding repeats plain greedy decoding exactly. Build without -ffast-math and with
 * -ffp-contract=off: the compiler must not reorder sums or fuse the scalar multiply-adds.
 *
 * Semantics are those of spectool.engine.model.Transformer.forward with a KV cache: each row
 * (slot, position) first writes its keys and values at that slot and position, then attends to
 * positions 0 .. its own of its slot. A row with position -1 is padding: nothing written, its
 * output is zeros.
 */
#include <cpuid.h>
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

typedef struct {
    const float *attn_norm;   /* [dim]; NULL: the attention input is the caller's attn_in */
    int64_t qkv_in;           /* the attention input's width: dim (2 dim for an EAGLE-3 head) */
    const uint16_t *wqkv;     /* [(H + 2 Hkv) D, qkv_in] float16 */
    const uint16_t *wo;       /* [dim, H D] */
    const float *ffn_norm;    /* [dim] */
    const uint16_t *w13;      /* [2 hidden, dim], gate rows first */
    const uint16_t *w2;       /* [dim, hidden] */
} Layer;

typedef struct {
    int64_t dim, n_layers, n_heads, n_kv_heads, head_dim, hidden;
    double eps;
    const Layer *layers;
    const float *final_norm;  /* [dim]; NULL: no final norm (normed is not written) */
    const float *rope;        /* [max_pos, 2, D]: cos, then sin with rotate-half's sign */
    int64_t max_pos;
} Model;

int spectool_native_abi(void) { return 4; }

/* An optional profile for benchmarks (off unless spectool_profile turned it on): nanoseconds
 * spent in the layers' weight products, in whole spectool_forward calls (their count too) and
 * in spectool_matmul. One thread drives the engine, so plain counters do. */
static int prof_on;
static int64_t prof[4]; /* layers' products ns, forward ns, forward calls, spectool_matmul ns */

static inline int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Copies the counters to out[4] (when out is not NULL), zeroes them, and turns the profile on
 * or off. */
void spectool_profile(int on, int64_t *out) {
    if (out) memcpy(out, prof, sizeof(prof));
    memset(prof, 0, sizeof(prof));
    prof_on = on;
}

static inline float hsum(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v);
    __m128 hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    __m128 sh = _mm_movehdup_ps(lo);
    __m128 s = _mm_add_ps(lo, sh);
    sh = _mm_movehl_ps(sh, s);
    s = _mm_add_ss(s, sh);
    return _mm_cvtss_f32(s);
}

static inline __m256 load_h(const uint16_t *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

static inline void prefetch(const uint16_t *w, int64_t count) {
    const char *p = (const char *)w;
    for (int64_t b = 0; b < count * 2; b += 64) _mm_prefetch(p + b, _MM_HINT_T0);
}

/* One output of one row: the same operations wherever it is called from. */
static inline float dot1(const float *x, const uint16_t *w, int64_t in) {
    __m256 a = _mm256_setzero_ps();
    for (int64_t i = 0; i < in; i += 8)
        a = _mm256_fmadd_ps(load_h(w + i), _mm256_loadu_ps(x + i), a);
    return hsum(a);
}

/* One row times the four outputs w0 .. w0 + 3 in (see rows_x4), the same sums: a one-row
 * product (every decode step at batch 1) ran 1.4-1.6x slower through rows_x4 with R = 1
 * compiled for 16 registers, here. */
static inline __attribute__((always_inline)) void
row_x4(const float *x, int64_t in, const uint16_t *w0, float *y, int add) {
    const uint16_t *w1 = w0 + in, *w2 = w1 + in, *w3 = w2 + in;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t i = 0; i < in; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        a0 = _mm256_fmadd_ps(load_h(w0 + i), v, a0);
        a1 = _mm256_fmadd_ps(load_h(w1 + i), v, a1);
        a2 = _mm256_fmadd_ps(load_h(w2 + i), v, a2);
        a3 = _mm256_fmadd_ps(load_h(w3 + i), v, a3);
    }
    if (add) {
        y[0] += hsum(a0); y[1] += hsum(a1); y[2] += hsum(a2); y[3] += hsum(a3);
    } else {
        y[0] = hsum(a0); y[1] = hsum(a1); y[2] = hsum(a2); y[3] = hsum(a3);
    }
}

/* One row's four sums (accumulators a0 .. a3 of outputs 0 .. 3) into y[0 .. 3] (+= when add),
 * paired exactly as hsum pairs them: low + high halves, then neighbours, then the two pairs
 * (hadd adds neighbours; a + b == b + a bit for bit). */
static inline __attribute__((always_inline)) void
sums_x4(__m256 a0, __m256 a1, __m256 a2, __m256 a3, float *y, int add) {
    const __m256 m01 = _mm256_add_ps(_mm256_permute2f128_ps(a0, a1, 0x20),
                                     _mm256_permute2f128_ps(a0, a1, 0x31));
    const __m256 m23 = _mm256_add_ps(_mm256_permute2f128_ps(a2, a3, 0x20),
                                     _mm256_permute2f128_ps(a2, a3, 0x31));
    const __m256 h = _mm256_hadd_ps(m01, m23); /* [a0 01, a0 23, a2 01, a2 23 | a1, a3] */
    const __m256 s = _mm256_hadd_ps(h, h);     /* [a0, a2, a0, a2 | a1, a3, a1, a3] */
    __m128 sums = _mm_unpacklo_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    if (add) sums = _mm_add_ps(_mm_loadu_ps(y), sums);
    _mm_storeu_ps(y, sums);
}

/* R rows (2 <= R <= 6, a constant once inlined) times the four outputs w0 .. w0 + 3 in of
 * y[r, j] = sum_i x[r, i] w[j, i] (+ y[r, j] when add): each widened weight vector serves R
 * rows. Each (row, output) is one accumulator over i in steps of 8, reduced in hsum's order:
 * bit for bit dot1, whatever R. in % 8 == 0. */
static inline __attribute__((always_inline)) void
rows_x4(const int R, const float *x, int64_t in, const uint16_t *w0, int64_t out, float *y,
        int add) {
    __m256 a[6][4];
#pragma GCC unroll 6
    for (int r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int o = 0; o < 4; o++) a[r][o] = _mm256_setzero_ps();
    for (int64_t i = 0; i < in; i += 8) {
        __m256 h[4];
#pragma GCC unroll 4
        for (int o = 0; o < 4; o++) h[o] = load_h(w0 + o * in + i);
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            const __m256 v = _mm256_loadu_ps(x + r * in + i);
#pragma GCC unroll 4
            for (int o = 0; o < 4; o++) a[r][o] = _mm256_fmadd_ps(h[o], v, a[r][o]);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) sums_x4(a[r][0], a[r][1], a[r][2], a[r][3], y + r * out, add);
}

/* y[r, j] = sum_i x[r, i] w[j, i] (+ y[r, j] when add) for r < n, j < out: outputs in fours,
 * rows in blocks of up to MAX (rows_x4; with AVX2's 16 vector registers MAX is 2: 8
 * accumulators, 4 weights, a row), the last outputs one by one (dot1). (A macro: it was also
 * the six-row kernel on AVX-512VL's 32 ymm registers, which matmul_rows_wide replaced; kept as
 * it was, since rewriting its loop as plain code made the one-row product, every decode step
 * at batch 1, 1.1x slower here.) */
#define MATMUL_ROWS(NAME, MAX, ATTR)                                                          \
    static __attribute__((noinline)) ATTR void NAME(const float *x, int64_t n, int64_t in,   \
                                                    const uint16_t *w, int64_t out, float *y, \
                                                    int add) {                               \
        int64_t j = 0;                                                                       \
        prefetch(w, (out < 8 ? out : 8) * in);                                               \
        for (; j + 4 <= out; j += 4) {                                                       \
            const uint16_t *w0 = w + j * in;                                                 \
            /* the weights two blocks ahead, requested now: at one row the product is bound  \
             * by memory (asking early is about 2x the hardware prefetcher alone here) */    \
            if (j + 12 <= out) prefetch(w0 + 8 * in, 4 * in);                                \
            for (int64_t r = 0; r < n;) {                                                    \
                const float *xr = x + r * in;                                                \
                float *yr = y + r * out + j;                                                 \
                switch (n - r < MAX ? n - r : MAX) {                                         \
                case 1: row_x4(xr, in, w0, yr, add); r += 1; break;                          \
                case 2: rows_x4(2, xr, in, w0, out, yr, add); r += 2; break;                 \
                case 3: rows_x4(3, xr, in, w0, out, yr, add); r += 3; break;                 \
                case 4: rows_x4(4, xr, in, w0, out, yr, add); r += 4; break;                 \
                case 5: rows_x4(5, xr, in, w0, out, yr, add); r += 5; break;                 \
                default: rows_x4(6, xr, in, w0, out, yr, add); r += 6; break;                \
                }                                                                            \
            }                                                                                \
        }                                                                                    \
        for (; j < out; j++)                                                                 \
            for (int64_t r = 0; r < n; r++) {                                                \
                float v = dot1(x + r * in, w + j * in, in);                                  \
                if (add) y[r * out + j] += v; else y[r * out + j] = v;                       \
            }                                                                                \
    }

MATMUL_ROWS(matmul_rows, 2, )

/* The same products on 512-bit vectors, for CPUs with AVX-512 (F, VL, DQ). A zmm register
 * holds two outputs' 8-lane accumulators side by side (low half output o, high half o + 1)
 * and each half does exactly the operations of rows_x4's ymm accumulator (the same weight
 * vector, the same 8 inputs broadcast to both halves, the same order), then the halves are
 * reduced in hsum's order: bit for bit dot1, whatever the rows. With 32 registers a block
 * takes up to WIDE_MAX rows (24 accumulators, 2 weights, a row), each widened weight serving
 * all of them. On an AMD EPYC of the Zen 5 family (two 512-bit FMA pipes: 131 GFMA/s a core,
 * against 66 on 256-bit vectors) the demo target's 49 products, standalone, 7 interleaved
 * rounds: 3 rows 0.47-0.49 ms against 0.62-0.67 on two rows a block, 5 rows 0.68-0.70 against
 * 0.99-1.01; 16 rows 1.90-2.07 against 2.61-2.64 and 80 rows 9.2-9.5 against 12.8-13.1 on the
 * six-row ymm kernel it replaced; at 1 and 2 rows slower (0.35-0.36 against 0.32-0.34; 0.41
 * against 0.37-0.40), so those stay on matmul_rows. */
#define WIDE_MAX 12
#define ZATTR __attribute__((target("avx2,fma,f16c,avx512f,avx512vl,avx512dq")))

static inline ZATTR __m512 load_h2(const uint16_t *a, const uint16_t *b) {
    const __m128i lo = _mm_loadu_si128((const __m128i *)a);
    const __m128i hi = _mm_loadu_si128((const __m128i *)b);
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1));
}

static inline ZATTR __attribute__((always_inline)) void
zrows_x4(const int R, const float *x, int64_t in, const uint16_t *w0, int64_t out, float *y,
         int add) {
    __m512 a[WIDE_MAX][2];
#pragma GCC unroll 12
    for (int r = 0; r < R; r++) a[r][0] = a[r][1] = _mm512_setzero_ps();
    for (int64_t i = 0; i < in; i += 8) {
        const __m512 h01 = load_h2(w0 + i, w0 + in + i);
        const __m512 h23 = load_h2(w0 + 2 * in + i, w0 + 3 * in + i);
#pragma GCC unroll 12
        for (int r = 0; r < R; r++) {
            const __m512 v = _mm512_broadcast_f32x8(_mm256_loadu_ps(x + r * in + i));
            a[r][0] = _mm512_fmadd_ps(h01, v, a[r][0]);
            a[r][1] = _mm512_fmadd_ps(h23, v, a[r][1]);
        }
    }
    /* each row's four accumulators: the halves of a[r][0] and a[r][1], reduced as rows_x4's */
#pragma GCC unroll 12
    for (int r = 0; r < R; r++)
        sums_x4(_mm512_castps512_ps256(a[r][0]), _mm512_extractf32x8_ps(a[r][0], 1),
                _mm512_castps512_ps256(a[r][1]), _mm512_extractf32x8_ps(a[r][1], 1),
                y + r * out, add);
}

#define ZCASE(R) case R: zrows_x4(R, xr, in, w0, out, yr, add); r += R; break;

static __attribute__((noinline)) ZATTR void matmul_rows_wide(const float *x, int64_t n,
                                                             int64_t in, const uint16_t *w,
                                                             int64_t out, float *y, int add) {
    int64_t j = 0;
    prefetch(w, (out < 8 ? out : 8) * in);
    for (; j + 4 <= out; j += 4) {
        const uint16_t *w0 = w + j * in;
        if (j + 12 <= out) prefetch(w0 + 8 * in, 4 * in);
        for (int64_t r = 0; r < n;) {
            const float *xr = x + r * in;
            float *yr = y + r * out + j;
            switch (n - r < WIDE_MAX ? n - r : WIDE_MAX) {
                ZCASE(1) ZCASE(2) ZCASE(3) ZCASE(4) ZCASE(5) ZCASE(6)
                ZCASE(7) ZCASE(8) ZCASE(9) ZCASE(10) ZCASE(11)
            default: zrows_x4(WIDE_MAX, xr, in, w0, out, yr, add); r += WIDE_MAX; break;
            }
        }
    }
    for (; j < out; j++)
        for (int64_t r = 0; r < n; r++) {
            float v = dot1(x + r * in, w + j * in, in);
            if (add) y[r * out + j] += v; else y[r * out + j] = v;
        }
}

/* The fewest rows matmul_rows_wide takes: a verify pass of k >= 2 drafts at batch 1 and every
 * larger product. (The earlier six-row kernel on 256-bit vectors started at 8 rows: below
 * that it did no better than two rows a block.) */
#define WIDE_MIN_ROWS 3

static int wide_ok = -1; /* -1: not asked yet; 0: matmul_rows (two rows), 256-bit attention;
                           1: matmul_rows_wide, attention's scores_2 and weigh_2 */

/* AVX-512F, DQ and VL (CPUID leaf 7), with the OS saving their registers (XCR0: SSE, AVX, the
 * opmask and the upper ZMM halves and ZMM16-31). Asked directly: GCC's __builtin_cpu_supports
 * links libgcc's CPU model tables into this library, and with them a one-row product took
 * 1.2-1.4x the time here without the wide kernel ever running (separate processes,
 * interleaved; why was not established). */
static int wide_supported(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(b & (1u << 16)) || !(b & (1u << 17)) ||
        !(b & (1u << 31)))
        return 0;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return 0; /* OSXSAVE */
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (lo & 0xe6) == 0xe6;
}

/* on = 1: products use matmul_rows_wide where the CPU supports it; 0: matmul_rows, two rows a
 * block (what a CPU without AVX-512VL runs; tests compare the two); -1: unchanged. Returns
 * whether the wide kernel is in use. */
int spectool_wide_rows(int on) {
    if (wide_ok < 0 || on >= 0) wide_ok = on != 0 && wide_supported();
    return wide_ok;
}

/* matmul_rows over chunks of rows whose activations stay in L2 (128 KB): for each block of
 * four outputs matmul_rows reads every row of x, so a long prefill's rows (300 rows of 704
 * floats: 840 KB) would otherwise come from L3 once per block (0.90-0.94x the time at 256-400
 * rows of the demo target's shapes, the same below 128 rows). Each (row, output) is computed
 * the same way whatever the chunk. */
static void matmul_(const float *x, int64_t n, int64_t in, const uint16_t *w, int64_t out,
                   float *y, int add) {
    int64_t chunk = 32768 / in;
    chunk = chunk < 8 ? 8 : chunk - chunk % 2;
    if (wide_ok < 0) wide_ok = wide_supported();
    for (int64_t r = 0; r < n; r += chunk) {
        const int64_t rows = n - r < chunk ? n - r : chunk;
        if (wide_ok && rows >= WIDE_MIN_ROWS)
            matmul_rows_wide(x + r * in, rows, in, w, out, y + r * out, add);
        else
            matmul_rows(x + r * in, rows, in, w, out, y + r * out, add);
    }
}

static void matmul(const float *x, int64_t n, int64_t in, const uint16_t *w, int64_t out,
                   float *y, int add) {
    int64_t t0 = prof_on ? now_ns() : 0;
    matmul_(x, n, in, w, out, y, add);
    if (prof_on) prof[0] += now_ns() - t0;
}

/* y [n, out] = x [n, in] w^T for w [out, in] float16 (the LM head): rows independent. */
void spectool_matmul(const float *x, int64_t n, int64_t in, const uint16_t *w, int64_t out,
                     float *y) {
    int64_t t0 = prof_on ? now_ns() : 0;
    matmul_(x, n, in, w, out, y, 0);
    if (prof_on) prof[3] += now_ns() - t0;
}

/* out = x / sqrt(mean(x^2) + eps) * weight, the mean of squares summed in double (in 8 lanes,
 * one order for every call). */
static void rms_norm(const float *x, const float *weight, int64_t dim, double eps, float *out) {
    __m256d a = _mm256_setzero_pd(), b = a; /* dim is a multiple of 8: two 4-lane sums */
    for (int64_t i = 0; i < dim; i += 8) {
        const __m256d lo = _mm256_cvtps_pd(_mm_loadu_ps(x + i));
        const __m256d hi = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4));
        a = _mm256_add_pd(a, _mm256_mul_pd(lo, lo));
        b = _mm256_add_pd(b, _mm256_mul_pd(hi, hi));
    }
    double lanes[4];
    _mm256_storeu_pd(lanes, _mm256_add_pd(a, b));
    const double ss = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
    float inv = (float)(1.0 / sqrt(ss / (double)dim + eps));
    for (int64_t i = 0; i < dim; i++) out[i] = (x[i] * inv) * weight[i];
}

/* x [heads, D] rotated in place: x * cos + [x2, x1] * sin_signed (Hugging Face's rotate-half). */
static void rope(float *x, int64_t heads, int64_t d, const float *cs) {
    const float *c = cs, *s = cs + d;
    int64_t half = d / 2;
    for (int64_t h = 0; h < heads; h++) {
        float *v = x + h * d;
        float tmp[512];
        for (int64_t i = 0; i < d; i++) {
            float sw = i < half ? v[i + half] : v[i - half];
            tmp[i] = v[i] * c[i] + sw * s[i];
        }
        memcpy(v, tmp, (size_t)d * sizeof(float));
    }
}

/* exp(x), 8 lanes (Cephes' expf: x = n ln2 + r, exp(r) by a polynomial; about 1 ulp), inputs
 * clamped to [-87.3, 88.4] so that 2^n stays a normal float. */
static inline __m256 exp256(__m256 x) {
    x = _mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f));
    x = _mm256_max_ps(x, _mm256_set1_ps(-87.3365478515625f));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), x);
    y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

/* Eight sums of eight vectors: [hsum(a[0]), ..., hsum(a[7])] (another order of additions than
 * hsum; the same for every call). */
static inline __m256 hsum8(const __m256 *a) {
    __m256 h01 = _mm256_hadd_ps(a[0], a[1]), h23 = _mm256_hadd_ps(a[2], a[3]);
    __m256 h45 = _mm256_hadd_ps(a[4], a[5]), h67 = _mm256_hadd_ps(a[6], a[7]);
    __m256 lo = _mm256_hadd_ps(h01, h23), hi = _mm256_hadd_ps(h45, h67);
    return _mm256_add_ps(_mm256_permute2f128_ps(lo, hi, 0x20), _mm256_permute2f128_ps(lo, hi, 0x31));
}

/* out[0:8] = sum over t of p[t] v[t * D + 0:8], in t order. */
static inline void weigh_values(const float *p, const float *v, int64_t len, int64_t D, float *out) {
    __m256 a = _mm256_setzero_ps();
    for (int64_t t = 0; t < len; t++) a = _mm256_fmadd_ps(_mm256_set1_ps(p[t]), _mm256_loadu_ps(v + t * D), a);
    _mm256_storeu_ps(out, a);
}

/* Scores of one query head qg [D] against keys [len, D]: sg[t] = (qg . key t) * scale. Keys in
 * blocks of 8 from position 0 (eight independent 8-lane sums, reduced by hsum8), the last len %
 * 8 one by one (reduced by hsum). */
static void scores_1(const float *qg, int64_t D, int64_t len, const float *keys, float scale,
                     float *sg) {
    int64_t t = 0;
    for (; t + 8 <= len; t += 8) {
        __m256 a[8];  /* eight keys side by side: eight independent sums */
        for (int k = 0; k < 8; k++) a[k] = _mm256_setzero_ps();
        for (int64_t i = 0; i < D; i += 8) {
            const __m256 qv = _mm256_loadu_ps(qg + i);
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++)
                a[k] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(keys + (t + k) * D + i), a[k]);
        }
        _mm256_storeu_ps(sg + t, _mm256_mul_ps(hsum8(a), _mm256_set1_ps(scale)));
    }
    for (; t < len; t++) {
        __m256 acc = _mm256_setzero_ps();
        for (int64_t i = 0; i < D; i += 8)
            acc = _mm256_fmadd_ps(_mm256_loadu_ps(qg + i), _mm256_loadu_ps(keys + t * D + i), acc);
        sg[t] = hsum(acc) * scale;
    }
}

/* scores_1 for two query heads q0, q1 at once on 512-bit vectors (AVX-512 CPUs): a zmm holds
 * head 0's 8-lane sum for a key in its low half and head 1's in its high half, each half doing
 * exactly scores_1's operations (every key's 8 floats broadcast to both halves); the halves are
 * reduced as scores_1 reduces them. Bit for bit scores_1 twice, with half the instructions. */
static __attribute__((noinline)) ZATTR void scores_2(const float *q0, const float *q1, int64_t D,
                                                     int64_t len, const float *keys, float scale,
                                                     float *s0, float *s1) {
    /* the two heads' queries side by side once, [q0 i..i+7 | q1 i..i+7] for each i: every key
     * block and every last key loads them as one vector (D <= 512, native_step.py's bind) */
    float qq[2 * 512];
    for (int64_t i = 0; i < D; i += 8) {
        _mm256_storeu_ps(qq + 2 * i, _mm256_loadu_ps(q0 + i));
        _mm256_storeu_ps(qq + 2 * i + 8, _mm256_loadu_ps(q1 + i));
    }
    int64_t t = 0;
    for (; t + 8 <= len; t += 8) {
        __m512 a[8];
        for (int k = 0; k < 8; k++) a[k] = _mm512_setzero_ps();
        for (int64_t i = 0; i < D; i += 8) {
            const __m512 qv = _mm512_loadu_ps(qq + 2 * i);
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++)
                a[k] = _mm512_fmadd_ps(
                    qv, _mm512_broadcast_f32x8(_mm256_loadu_ps(keys + (t + k) * D + i)), a[k]);
        }
        __m256 lo[8], hi[8];
        for (int k = 0; k < 8; k++)
            lo[k] = _mm512_castps512_ps256(a[k]), hi[k] = _mm512_extractf32x8_ps(a[k], 1);
        _mm256_storeu_ps(s0 + t, _mm256_mul_ps(hsum8(lo), _mm256_set1_ps(scale)));
        _mm256_storeu_ps(s1 + t, _mm256_mul_ps(hsum8(hi), _mm256_set1_ps(scale)));
    }
    for (; t < len; t++) {
        __m512 acc = _mm512_setzero_ps();
        for (int64_t i = 0; i < D; i += 8)
            acc = _mm512_fmadd_ps(_mm512_loadu_ps(qq + 2 * i),
                                  _mm512_broadcast_f32x8(_mm256_loadu_ps(keys + t * D + i)), acc);
        s0[t] = hsum(_mm512_castps512_ps256(acc)) * scale;
        s1[t] = hsum(_mm512_extractf32x8_ps(acc, 1)) * scale;
    }
}

/* sg[0 .. len) = softmax(sg[0 .. len)); sg[len .. padded) is scratch. The maximum in 8 lanes
 * (the same value as any order), the sum in 8 lanes over t (then hsum): one order, whatever
 * the call, and no chain of len dependent additions. */
static void softmax(float *sg, int64_t len) {
    const int64_t padded = (len + 7) / 8 * 8;
    __m256 m8 = _mm256_set1_ps(-INFINITY);
    int64_t t = 0;
    for (; t + 8 <= len; t += 8) m8 = _mm256_max_ps(m8, _mm256_loadu_ps(sg + t));
    float mx = -INFINITY, lanes[8];
    _mm256_storeu_ps(lanes, m8);
    for (int k = 0; k < 8; k++) mx = lanes[k] > mx ? lanes[k] : mx;
    for (; t < len; t++) mx = sg[t] > mx ? sg[t] : mx;
    for (t = len; t < padded; t++) sg[t] = mx - 1000.0f;  /* exp underflows to ~1e-38 */
    m8 = _mm256_set1_ps(mx);
    __m256 s8 = _mm256_setzero_ps();
    for (t = 0; t < padded; t += 8) {
        const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(sg + t), m8));
        _mm256_storeu_ps(sg + t, e);
        if (t + 8 <= len)
            s8 = _mm256_add_ps(s8, e);
        else  /* the last block: only its len % 8 real positions */
            s8 = _mm256_add_ps(s8, _mm256_and_ps(e, _mm256_castsi256_ps(_mm256_cmpgt_epi32(
                _mm256_set1_epi32((int)(len - t)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)))));
    }
    const __m256 inv = _mm256_set1_ps(1.0f / hsum(s8));
    for (t = 0; t < padded; t += 8) _mm256_storeu_ps(sg + t, _mm256_mul_ps(_mm256_loadu_ps(sg + t), inv));
}

/* out0[0:64], out1[0:64] = sums over t of p0[t] v[t, 0:64], p1[t] v[t, 0:64], in t order, on
 * 512-bit vectors (each lane's operations those of the ymm loop in attend). */
static __attribute__((noinline)) ZATTR void weigh_2(const float *p0, const float *p1,
                                                    const float *vals, int64_t len, int64_t D,
                                                    float *out0, float *out1) {
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    __m512 b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    for (int64_t t = 0; t < len; t++) {
        const float *v = vals + t * D;
        const __m512 v0 = _mm512_loadu_ps(v), v1 = _mm512_loadu_ps(v + 16);
        const __m512 v2 = _mm512_loadu_ps(v + 32), v3 = _mm512_loadu_ps(v + 48);
        const __m512 q0 = _mm512_set1_ps(p0[t]), q1 = _mm512_set1_ps(p1[t]);
        a0 = _mm512_fmadd_ps(q0, v0, a0); a1 = _mm512_fmadd_ps(q0, v1, a1);
        a2 = _mm512_fmadd_ps(q0, v2, a2); a3 = _mm512_fmadd_ps(q0, v3, a3);
        b0 = _mm512_fmadd_ps(q1, v0, b0); b1 = _mm512_fmadd_ps(q1, v1, b1);
        b2 = _mm512_fmadd_ps(q1, v2, b2); b3 = _mm512_fmadd_ps(q1, v3, b3);
    }
    _mm512_storeu_ps(out0, a0); _mm512_storeu_ps(out0 + 16, a1);
    _mm512_storeu_ps(out0 + 32, a2); _mm512_storeu_ps(out0 + 48, a3);
    _mm512_storeu_ps(out1, b0); _mm512_storeu_ps(out1 + 16, b1);
    _mm512_storeu_ps(out1 + 32, b2); _mm512_storeu_ps(out1 + 48, b3);
}

/* The `groups` query heads q [groups, D] that share one kv head attend to its keys and values
 * [len, D] (positions 0 .. len - 1): out [groups, D]. One pass over the keys and one per 32
 * dimensions over the values serve two of the group's heads (64 dimensions on AVX-512 CPUs,
 * the same numbers). scores: groups * (len + 8) floats. Every number depends only on q, the
 * cache and len (keys in blocks of 8 from position 0). */
static void attend(const float *q, int64_t groups, int64_t D, int64_t len, const float *keys,
                   const float *vals, float scale, float *scores, float *out) {
    const int64_t stride = (len + 7) / 8 * 8;
    int64_t g = 0;
    if (wide_ok == 1)
        for (; g + 2 <= groups; g += 2)
            scores_2(q + g * D, q + (g + 1) * D, D, len, keys, scale, scores + g * stride,
                     scores + (g + 1) * stride);
    for (; g < groups; g++) scores_1(q + g * D, D, len, keys, scale, scores + g * stride);
    for (g = 0; g < groups; g++) softmax(scores + g * stride, len);
    /* out[g, d] = sum over t of p[g, t] v[t, d], in t order for every (g, d); two heads x 32
     * dimensions at a time (8 named accumulators, kept in registers), then one head, then 8
     * dimensions: the grouping never changes a sum. */
    for (g = 0; g + 2 <= groups; g += 2) {
        const float *p0 = scores + g * stride, *p1 = p0 + stride;
        int64_t i = 0;
        if (wide_ok == 1)
            for (; i + 64 <= D; i += 64)
                weigh_2(p0, p1, vals + i, len, D, out + g * D + i, out + (g + 1) * D + i);
        for (; i + 32 <= D; i += 32) {
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            __m256 b0 = a0, b1 = a0, b2 = a0, b3 = a0;
            for (int64_t t = 0; t < len; t++) {
                const float *v = vals + t * D + i;
                const __m256 v0 = _mm256_loadu_ps(v), v1 = _mm256_loadu_ps(v + 8);
                const __m256 v2 = _mm256_loadu_ps(v + 16), v3 = _mm256_loadu_ps(v + 24);
                const __m256 q0 = _mm256_set1_ps(p0[t]), q1 = _mm256_set1_ps(p1[t]);
                a0 = _mm256_fmadd_ps(q0, v0, a0); a1 = _mm256_fmadd_ps(q0, v1, a1);
                a2 = _mm256_fmadd_ps(q0, v2, a2); a3 = _mm256_fmadd_ps(q0, v3, a3);
                b0 = _mm256_fmadd_ps(q1, v0, b0); b1 = _mm256_fmadd_ps(q1, v1, b1);
                b2 = _mm256_fmadd_ps(q1, v2, b2); b3 = _mm256_fmadd_ps(q1, v3, b3);
            }
            float *o0 = out + g * D + i, *o1 = o0 + D;
            _mm256_storeu_ps(o0, a0); _mm256_storeu_ps(o0 + 8, a1);
            _mm256_storeu_ps(o0 + 16, a2); _mm256_storeu_ps(o0 + 24, a3);
            _mm256_storeu_ps(o1, b0); _mm256_storeu_ps(o1 + 8, b1);
            _mm256_storeu_ps(o1 + 16, b2); _mm256_storeu_ps(o1 + 24, b3);
        }
        for (; i < D; i += 8) weigh_values(p0, vals + i, len, D, out + g * D + i), weigh_values(p1, vals + i, len, D, out + (g + 1) * D + i);
    }
    for (; g < groups; g++)
        for (int64_t i = 0; i < D; i += 8) weigh_values(scores + g * stride, vals + i, len, D, out + g * D + i);
}

/* Scratch floats one forward of n rows needs (see spectool_forward). */
int64_t spectool_scratch_floats(const Model *m, int64_t n, int64_t max_len) {
    int64_t qkv = (m->n_heads + 2 * m->n_kv_heads) * m->head_dim;
    return n * (2 * m->dim + qkv + m->n_heads * m->head_dim + 2 * m->hidden)
        + (m->n_heads / m->n_kv_heads) * (max_len + 8);
}

/*
 * x [n, dim]: the rows' embeddings, on return the residual stream after the last layer.
 * pos [n], slot [n]: each row's position (-1: padding) and cache slot.
 * kv: the cache, [n_layers, n_slots, 2 Hkv, max_seq, D] float32 (keys, then values).
 * capture [n_capture] layer indices whose output is copied to captured [n, n_capture * dim].
 * normed [n, dim]: the final norm of x. attn_in [n, qkv_in]: the attention input of layers
 * without attn_norm (an EAGLE-3 head's [norm(embedding); norm(hidden)]), else NULL. scratch: spectool_scratch_floats(m, n, max_len) floats,
 * max_len being 1 + the largest position.
 * Returns 0, -1 when a position lies outside the rope table or the cache, -2 without attn_in
 * where a layer needs it.
 */
static int forward_(const Model *m, int64_t n, float *x, const int64_t *pos,
                    const int64_t *slot, float *kv, int64_t n_slots, int64_t max_seq,
                    int64_t n_capture, const int64_t *capture, float *captured, float *normed,
                    const float *attn_in, float *scratch) {
    const int64_t dim = m->dim, H = m->n_heads, Hkv = m->n_kv_heads, D = m->head_dim;
    const int64_t hidden = m->hidden, groups = H / Hkv, qkv_n = (H + 2 * Hkv) * D;
    int64_t max_len = 0;
    for (int64_t l = 0; l < m->n_layers; l++)
        if (!m->layers[l].attn_norm && !attn_in) return -2;
    for (int64_t r = 0; r < n; r++) {
        if (pos[r] >= m->max_pos || pos[r] >= max_seq || slot[r] < 0 || slot[r] >= n_slots)
            return -1;
        if (pos[r] + 1 > max_len) max_len = pos[r] + 1;
    }
    float *h = scratch;                 /* [n, 2 dim] normed input of a sublayer */
    float *qkv = h + n * 2 * dim;       /* [n, qkv_n] */
    float *att = qkv + n * qkv_n;       /* [n, H D] */
    float *gu = att + n * H * D;        /* [n, 2 hidden] */
    float *scores = gu + n * 2 * hidden; /* [groups, max_len + 8] */
    const float scale = (float)(1.0 / sqrt((double)D));
    const int64_t layer_stride = n_slots * 2 * Hkv * max_seq * D;
    const int64_t slot_stride = 2 * Hkv * max_seq * D, head_stride = max_seq * D;

    for (int64_t l = 0; l < m->n_layers; l++) {
        const Layer *L = &m->layers[l];
        float *kvl = kv + l * layer_stride;
        const float *in = attn_in;
        if (L->attn_norm) {
            for (int64_t r = 0; r < n; r++) rms_norm(x + r * dim, L->attn_norm, dim, m->eps, h + r * dim);
            in = h;
        }
        matmul(in, n, L->qkv_in, L->wqkv, qkv_n, qkv, 0);
        for (int64_t r = 0; r < n; r++) {
            if (pos[r] < 0) continue;
            float *row = qkv + r * qkv_n;
            rope(row, H + Hkv, D, m->rope + pos[r] * 2 * D);
            float *base = kvl + slot[r] * slot_stride + pos[r] * D;
            for (int64_t g = 0; g < 2 * Hkv; g++)
                memcpy(base + g * head_stride, row + (H + g) * D, (size_t)D * sizeof(float));
        }
        for (int64_t r = 0; r < n; r++) {
            float *out = att + r * H * D;
            if (pos[r] < 0) { memset(out, 0, (size_t)(H * D) * sizeof(float)); continue; }
            const float *sbase = kvl + slot[r] * slot_stride;
            for (int64_t j = 0; j < Hkv; j++)
                attend(qkv + r * qkv_n + j * groups * D, groups, D, pos[r] + 1,
                       sbase + j * head_stride, sbase + (Hkv + j) * head_stride, scale, scores,
                       out + j * groups * D);
        }
        matmul(att, n, H * D, L->wo, dim, x, 1); /* residual: x += attention output */
        for (int64_t r = 0; r < n; r++) rms_norm(x + r * dim, L->ffn_norm, dim, m->eps, h + r * dim);
        matmul(h, n, dim, L->w13, 2 * hidden, gu, 0);
        for (int64_t r = 0; r < n; r++) {
            float *g = gu + r * 2 * hidden, *u = g + hidden;
            const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
            for (int64_t i = 0; i < hidden; i += 8) {  /* silu(g) * u = g / (1 + exp(-g)) * u */
                __m256 gv = _mm256_loadu_ps(g + i);
                __m256 sig = _mm256_add_ps(one, exp256(_mm256_sub_ps(zero, gv)));
                _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_div_ps(gv, sig), _mm256_loadu_ps(u + i)));
            }
        }
        /* row r's activations gu[r, :hidden] packed to [n, hidden] (in order: no overlap) */
        for (int64_t r = 0; r < n; r++) memmove(gu + r * hidden, gu + r * 2 * hidden, (size_t)hidden * sizeof(float));
        matmul(gu, n, hidden, L->w2, dim, x, 1);
        for (int64_t c = 0; c < n_capture; c++)
            if (capture[c] == l)
                for (int64_t r = 0; r < n; r++)
                    memcpy(captured + (r * n_capture + c) * dim, x + r * dim, (size_t)dim * sizeof(float));
    }
    for (int64_t r = 0; r < n && m->final_norm; r++) {
        if (pos[r] < 0) { memset(normed + r * dim, 0, (size_t)dim * sizeof(float)); continue; }
        rms_norm(x + r * dim, m->final_norm, dim, m->eps, normed + r * dim);
    }
    return 0;
}

/* forward_ (above), timed when the profile is on. */
int spectool_forward(const Model *m, int64_t n, float *x, const int64_t *pos,
                     const int64_t *slot, float *kv, int64_t n_slots, int64_t max_seq,
                     int64_t n_capture, const int64_t *capture, float *captured, float *normed,
                     const float *attn_in, float *scratch) {
    int64_t t0 = prof_on ? now_ns() : 0;
    int status = forward_(m, n, x, pos, slot, kv, n_slots, max_seq, n_capture, capture,
                          captured, normed, attn_in, scratch);
    if (prof_on) {
        prof[1] += now_ns() - t0;
        prof[2] += 1;
    }
    return status;
}
