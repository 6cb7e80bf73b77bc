/* The greedy token of each row of final hidden states, and its logit, without computing every logit in float32.
 *
 * At 64 decode rows of the default model, the LM head is 15% of a step, spent only to take each row's argmax.
 * Here an int8 copy of the head (greedy_head.py) gives every logit approximately, four products per
 * instruction (AVX512_VNNI), with a bound on the approximation's error that holds for that logit whatever the
 * inputs; the panels of the vocabulary whose every logit is then certainly below another logit are skipped, and
 * the others are computed by the layer's own kernel (packed_linear.c's packed_panel_row, passed in). The token
 * and its logit are therefore those the full float32 product and row_max.c give, bit for bit, ties and batch
 * invariance included.
 *
 * The bound, for row x and vocabulary row w (float32 logit v, summed as the layer sums it):
 *   x is split in blocks of BLOCK and each block rounded to codes of one scale: x = x' + e.
 *   w' is the int8 copy, a float16 scale per block: w = w' + f (f is zero for a GGUF Q8_0 head).
 *   x . w - x' . w' = e . w + x' . f, so |x . w - x' . w'| <= sum over blocks |e_b| |w_b| + |x'| |f|.
 *   The float32 sum v differs from x . w by at most k u |x| |w| (k steps, u = 2^-24, one rounding a step), and
 *   the approximation as computed from x' . w' by about (k / 32 + 2) u |x'| |w'|: both, with the rounding of
 *   x' and of the comparisons, lie within slack (|x| + |x'|) N, N >= |w|, |w'|, slack = SLACK_UNITS (k + 64) u.
 * Every norm is stored rounded up and every computed one inflated (by 1 + INFLATE_UNITS (k + 64) u, where the
 * sum of k squares rounds by at most k u), so rounding only widens the bound.
 * A panel is kept where some logit's approximation plus its bound reaches the row's largest approximation minus
 * bound: every logit outside the kept panels lies below that, which the row's largest logit reaches. On the
 * default model's greedy rows, 2.7 panels of 1024 are kept on average (72 at most).
 *
 * A row holding NaN or infinity, or large enough that the bound could overflow, computes every panel, so it
 * gives what row_max.c gives (the first NaN where there is one).
 *
 * Without VNNI there is no head (greedy_head_columns is 0): the same bound with AVX2's byte products, which add
 * pairs into 16 bits and so take 7-bit codes of x (19 panels kept on average), measured level with the float32
 * head at 64 rows (the AVX2 build on an AMD Zen 4), as its three instructions per four products cost about
 * what the float32 multiply-adds do.
 */
#include <immintrin.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "entry.h"

/* One row times one panel of a weight, as the layer computes it: packed_linear.c's packed_panel_row. */
typedef void (*panel_row_fn)(const float *x, const void *w, int64_t panel, int64_t k_in, int64_t block_bytes,
                             float *out);

#define BLOCK 32    /* steps of k per scale of x and of the int8 weights */
#define QUADS 8     /* groups of four steps of k per block: one 32-bit lane holds a column's four codes */
#define UNIT 0x1p-24f   /* u, float32's unit roundoff */
#define INFLATE_UNITS 16 /* a computed norm's inflation, in units of (k + 64) u: 16 times its worst rounding */
#define SLACK_UNITS 4    /* the sums' rounding allowed for, in units of (k + 64) u: twice the worst */
#define HUGE_BOUND 1e30f /* |x| N beyond this may overflow the bound: the row is computed in full */

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define VEC 16
#define X_LIMIT 127 /* x's codes lie in [-X_LIMIT, X_LIMIT] */
typedef __m512i ivec;
typedef __m512 fvec;
#define FZERO _mm512_setzero_ps()
#define LOAD_F16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p)))
#define LOAD_I(p) _mm512_loadu_si512((const void *)(p))
#define LOAD_F(p) _mm512_loadu_ps(p)
#define SET_I(v) _mm512_set1_epi32(v)
#define SET_F(v) _mm512_set1_ps(v)
#define TO_F(a) _mm512_cvtepi32_ps(a)
#define FMA(a, b, c) _mm512_fmadd_ps(a, b, c)
#define MUL(a, b) _mm512_mul_ps(a, b)
#define ADD(a, b) _mm512_add_ps(a, b)
#define SUB(a, b) _mm512_sub_ps(a, b)
#define MAX(a, b) _mm512_max_ps(a, b)
#define HMAX(a) _mm512_reduce_max_ps(a)
/* Four products of unsigned (w) and signed (x) bytes added into each 32-bit lane of acc. */
#define DOT4(acc, w, x) _mm512_dpbusd_epi32(acc, w, x)

/* The copy's codes are stored as unsigned bytes, code + W_OFFSET, and x's as signed ones: each sum then starts at
 * -W_OFFSET times the sum of x's block of codes, one number per row and block, where the other way round would
 * store each column's sum of codes in the copy (2 bytes a column and block more to stream). Folding the broadcast
 * of x's codes into the multiply-add as a memory operand (inline assembly) measured level at 1 to 64 rows. */
#define W_OFFSET 128
#define PANEL_VECS 3  /* vectors per panel: packed_linear.c's panels of 48 columns, whose exact sums pick takes */
#define COLUMNS (PANEL_VECS * VEC)
/* A tile is up to TILE_ROWS rows by one vector of a panel (8 codes' sums in registers, each weight vector loaded
 * once for all of them), or, in a call of fewer than WIDE_CALL_ROWS rows and for the rows left after 8-row tiles,
 * up to WIDE_ROWS rows by the panel's three vectors (15 codes' sums: more in flight, and each code of x broadcast
 * once for three vectors; the logits' sums and bounds, touched once a block, may live in memory). Measured on an
 * AMD Zen 4 against 8-row tiles throughout, the default model's head: 0.66-0.69x the time at 4 rows, 0.81-0.85x
 * at 8, 0.93x at 32, but 1.02-1.05x at 64 and 128. Six rows by three vectors spilled the codes' sums (1.1-1.5x). */
#define TILE_ROWS 8
#define WIDE_ROWS 5
#define WIDE_CALL_ROWS 32
#define TILE_SUMS (WIDE_ROWS * PANEL_VECS) /* the most sums a tile keeps: rows times vectors */
/* Bytes ahead that each block prefetches of the copy, which streams from memory (packed_linear.c's distance). */
#define PREFETCH_BYTES 8192

int64_t greedy_head_columns(void) { return COLUMNS; }

/* A block of a panel in the int8 copy: float16 scales, float16 norms of the float32 weights' block (rounded up),
 * then per quad of steps of k each column's four codes (offset by W_OFFSET). */
#define BLOCK_BYTES (COLUMNS * (4 + BLOCK))

/* A row's statistics after its codes: per block the scale of x's codes, the norm of their error and the sum of
 * the codes, then the row's slack (see above) times |x| + |x'|, |x'| and whether it is computed whole. */
#define STATS(blocks) (3 * (blocks) + 3)

/* The factor every computed norm is inflated by, and the slack, for sums over k_in steps (see above). */
static inline float inflation(int64_t k_in) { return 1 + INFLATE_UNITS * (k_in + 64) * UNIT; }
static inline float slack(int64_t k_in) { return SLACK_UNITS * (k_in + 64) * UNIT; }

static inline int finite_bits(float v) {
    uint32_t bits;
    memcpy(&bits, &v, 4);
    return (bits & 0x7f800000u) != 0x7f800000u;
}

static inline int nan_bits(float v) {
    uint32_t bits;
    memcpy(&bits, &v, 4);
    return (bits & 0x7fffffffu) > 0x7f800000u;
}

/* One row of x as codes and its statistics (STATS). */
static void quantize_row(const float *x, int64_t k_in, float max_norm, int8_t *codes, float *stats) {
    const int64_t blocks = k_in / BLOCK;
    float x_sq = 0, code_sq = 0;
    int whole = 0;
    for (int64_t i = 0; i < k_in; i++) whole |= !finite_bits(x[i]);
    for (int64_t b = 0; b < blocks; b++) {
        const float *xb = x + b * BLOCK;
        float amax = 0;
        for (int i = 0; i < BLOCK; i++) amax = fabsf(xb[i]) > amax ? fabsf(xb[i]) : amax;
        const float scale = whole ? 0 : amax / X_LIMIT, inverse = scale > 0 ? X_LIMIT / amax : 0;
        float error_sq = 0, code_sum = 0;
        for (int i = 0; i < BLOCK; i++) {
            float q = whole ? 0 : nearbyintf(xb[i] * inverse);
            q = q > X_LIMIT ? X_LIMIT : q < -X_LIMIT ? -X_LIMIT : q;
            const float rounded = scale * q, error = whole ? 0 : xb[i] - rounded;
            codes[b * BLOCK + i] = (int8_t)q;
            code_sum += q;
            error_sq += error * error;
            code_sq += rounded * rounded;
            x_sq += whole ? 0 : xb[i] * xb[i];
        }
        stats[b] = scale;
        stats[blocks + b] = sqrtf(error_sq) * inflation(k_in);
        stats[2 * blocks + b] = code_sum;
    }
    const float x_norm = sqrtf(x_sq) * inflation(k_in), code_norm = sqrtf(code_sq) * inflation(k_in);
    whole |= !(x_norm * max_norm < HUGE_BOUND);
    stats[3 * blocks] = slack(k_in) * (x_norm + code_norm);
    stats[3 * blocks + 1] = code_norm;
    stats[3 * blocks + 2] = (float)whole;
}

/* For `rows` rows and `vecs` vectors of VEC columns of one panel, from vector j (rows * vecs at most TILE_SUMS):
 * the approximate logits and their bounds, folded into each row's running maxima of approximation plus bound
 * (upper) and approximation minus bound (lower). Each block also prefetches the bytes PREFETCH_BYTES after it,
 * where `prefetch` is set. */
static inline __attribute__((always_inline)) void approximate_tile(
    const uint8_t *panel, int64_t j, int64_t blocks, const int8_t *codes, const float *stats, int64_t k_in,
    const float *norms, const float *weight_errors, fvec *upper, fvec *lower, int prefetch, const int rows,
    const int vecs) {
    const int64_t stat_size = STATS(blocks);
    fvec sums[TILE_SUMS], bounds[TILE_SUMS]; /* [r * vecs + v] */
    for (int i = 0; i < rows * vecs; i++) sums[i] = FZERO, bounds[i] = FZERO;
    for (int64_t b = 0; b < blocks; b++) {
        const uint8_t *block = panel + b * BLOCK_BYTES;
        if (prefetch)
            for (int line = 0; line < BLOCK_BYTES; line += 64) __builtin_prefetch(block + PREFETCH_BYTES + line, 0, 1);
        fvec scale[PANEL_VECS], norm[PANEL_VECS];
        ivec dots[TILE_SUMS];
        for (int v = 0; v < vecs; v++) {
            scale[v] = LOAD_F16(block + 2 * (j + v) * VEC);
            norm[v] = LOAD_F16(block + 2 * COLUMNS + 2 * (j + v) * VEC);
        }
        /* The copy's codes carry W_OFFSET: each sum starts at -W_OFFSET times the sum of x's codes. */
        for (int r = 0; r < rows; r++) {
            const ivec start = SET_I(-W_OFFSET * (int32_t)stats[r * stat_size + 2 * blocks + b]);
            for (int v = 0; v < vecs; v++) dots[r * vecs + v] = start;
        }
        const uint8_t *w = block + 4 * COLUMNS + 4 * j * VEC;
        for (int q = 0; q < QUADS; q++) {
            ivec weights[PANEL_VECS];
            for (int v = 0; v < vecs; v++) weights[v] = LOAD_I(w + q * 4 * COLUMNS + 4 * v * VEC);
            for (int r = 0; r < rows; r++) {
                int32_t four;
                memcpy(&four, codes + r * k_in + b * BLOCK + 4 * q, 4);
                const ivec x = SET_I(four);
                for (int v = 0; v < vecs; v++) dots[r * vecs + v] = DOT4(dots[r * vecs + v], weights[v], x);
            }
        }
        for (int r = 0; r < rows; r++) {
            const fvec x_scale = SET_F(stats[r * stat_size + b]), x_error = SET_F(stats[r * stat_size + blocks + b]);
            for (int v = 0; v < vecs; v++) {
                sums[r * vecs + v] = FMA(TO_F(dots[r * vecs + v]), MUL(scale[v], x_scale), sums[r * vecs + v]);
                bounds[r * vecs + v] = FMA(norm[v], x_error, bounds[r * vecs + v]);
            }
        }
    }
    for (int r = 0; r < rows; r++) {
        const float *s = stats + r * stat_size + 3 * blocks;
        for (int v = 0; v < vecs; v++) {
            const fvec n = LOAD_F(norms + (j + v) * VEC), f = LOAD_F(weight_errors + (j + v) * VEC);
            const fvec bound =
                FMA(SET_F(s[0]), n, FMA(SET_F(s[1]), f, MUL(bounds[r * vecs + v], SET_F(inflation(k_in)))));
            upper[r] = MAX(upper[r], ADD(sums[r * vecs + v], bound));
            lower[r] = MAX(lower[r], SUB(sums[r * vecs + v], bound));
        }
    }
}

/* Rows [first, first + rows) of panel p, one vector at a time or all at once (`wide`): each row's upper and lower
 * maxima over the panel's columns into bounds (row r's at r * 2 panels + 2 p). */
static inline __attribute__((always_inline)) void approximate_panel(
    const uint8_t *panel, int64_t p, int64_t panels, int64_t blocks, const int8_t *codes, const float *stats,
    int64_t k_in, const float *norms, const float *weight_errors, float *bounds, int64_t first, const int rows,
    const int wide) {
    fvec upper[TILE_ROWS], lower[TILE_ROWS];
    for (int r = 0; r < rows; r++) upper[r] = SET_F(-FLT_MAX), lower[r] = SET_F(-FLT_MAX);
    codes += first * k_in, stats += first * STATS(blocks), norms += p * COLUMNS, weight_errors += p * COLUMNS;
    if (wide)
        approximate_tile(panel, 0, blocks, codes, stats, k_in, norms, weight_errors, upper, lower, first == 0, rows,
                         PANEL_VECS);
    else
        for (int64_t j = 0; j < PANEL_VECS; j++)
            approximate_tile(panel, j, blocks, codes, stats, k_in, norms, weight_errors, upper, lower,
                             first == 0 && j == 0, rows, 1);
    for (int r = 0; r < rows; r++) {
        bounds[(first + r) * 2 * panels + 2 * p] = HMAX(upper[r]);
        bounds[(first + r) * 2 * panels + 2 * p + 1] = HMAX(lower[r]);
    }
}

#define WIDE_CASE(n) \
    case n: approximate_panel(panel, p, panels, blocks, codes, stats, k_in, norms, weight_errors, bounds, first, n, 1); break;

/* The row's token and logit from the panels its bounds keep (every panel for a row computed whole). */
static void pick(const float *x, const float *row_bounds, int whole, int64_t panels, panel_row_fn panel_row,
                 const void *exact, int64_t k_in, int64_t block_bytes, float *value, int64_t *index) {
    float floor = -FLT_MAX, logits[COLUMNS];
    for (int64_t p = 0; p < panels; p++) floor = row_bounds[2 * p + 1] > floor ? row_bounds[2 * p + 1] : floor;
    float best = 0;
    int64_t best_index = -1;
    for (int64_t p = 0; p < panels; p++) {
        if (!whole && row_bounds[2 * p] < floor)
            continue;
        panel_row(x, exact, p, k_in, block_bytes, logits);
        for (int64_t c = 0; c < COLUMNS; c++) {
            if (nan_bits(logits[c])) { /* row_max.c's answer for a row holding NaN: its first */
                *value = logits[c], *index = p * COLUMNS + c;
                return;
            }
            if (best_index < 0 || logits[c] > best)
                best = logits[c], best_index = p * COLUMNS + c;
        }
    }
    *value = best, *index = best_index;
}

/* Each row's greedy token (indices) and its logit (values) for x [rows, k_in] through a vocabulary of `panels`
 * panels of COLUMNS: `approx` the int8 copy, `norms` and `weight_errors` [vocab] each column's N and |f|
 * (rounded up), max_norm the largest N; `panel_row` computes a panel exactly from the layer's weight `exact`
 * (block_bytes as packed_linear.c takes it). Scratch: codes [rows, k_in] bytes, stats [rows, STATS] and bounds
 * [rows, 2 panels] floats. */
void greedy_head(const float *x, const uint8_t *approx, const float *norms, const float *weight_errors,
                 int8_t *codes, float *stats, float *bounds, float *values, int64_t *indices, int64_t rows,
                 int64_t k_in, int64_t panels, panel_row_fn panel_row, const void *exact, int64_t block_bytes,
                 float max_norm) {
    const int64_t blocks = k_in / BLOCK, panel_bytes = blocks * BLOCK_BYTES;
#pragma omp parallel
    {
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++)
            quantize_row(x + r * k_in, k_in, max_norm, codes + r * k_in, stats + r * STATS(blocks));
#pragma omp for schedule(dynamic, 16)
        for (int64_t p = 0; p < panels; p++) {
            const uint8_t *panel = approx + p * panel_bytes;
            for (int64_t first = 0; first < rows;) {
                if (rows >= WIDE_CALL_ROWS && rows - first >= TILE_ROWS) {
                    approximate_panel(panel, p, panels, blocks, codes, stats, k_in, norms, weight_errors, bounds,
                                      first, TILE_ROWS, 0);
                    first += TILE_ROWS;
                    continue;
                }
                const int64_t count = rows - first < WIDE_ROWS ? rows - first : WIDE_ROWS;
                switch (count) { WIDE_CASE(1) WIDE_CASE(2) WIDE_CASE(3) WIDE_CASE(4) WIDE_CASE(5) }
                first += count;
            }
        }
#pragma omp for schedule(dynamic, 1)
        for (int64_t r = 0; r < rows; r++)
            pick(x + r * k_in, bounds + r * 2 * panels, stats[r * STATS(blocks) + 3 * blocks + 2] != 0, panels,
                 panel_row, exact, k_in, block_bytes, values + r, indices + r);
    }
}

#else
int64_t greedy_head_columns(void) { return 0; }

void greedy_head(const float *x, const uint8_t *approx, const float *norms, const float *weight_errors,
                 int8_t *codes, float *stats, float *bounds, float *values, int64_t *indices, int64_t rows,
                 int64_t k_in, int64_t panels, panel_row_fn panel_row, const void *exact, int64_t block_bytes,
                 float max_norm) {
    abort(); /* greedy_head_columns() says there is none: greedy_head.py builds no head */
}
#endif

void greedy_head_entry(const int64_t *args) {
    greedy_head(ARG(0, const float *), ARG(1, const uint8_t *), ARG(2, const float *), ARG(3, const float *),
                ARG(4, int8_t *), ARG(5, float *), ARG(6, float *), ARG(7, float *), ARG(8, int64_t *), args[9],
                args[10], args[11], ARG(12, panel_row_fn), ARG(13, const void *), args[14], float_arg(args, 15));
}
