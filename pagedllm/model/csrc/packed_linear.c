/* Linear layers on CPU over weights packed in panels: out[m][n] = x[m] . w[n] (times scales[n] for int8).
 *
 * The weight [n_out, k_in] is stored as panels of PANEL output columns, each panel [k_in][PANEL]
 * contiguous, so that one step of k reads one short contiguous row of the panel. A tile of TILE_ROWS rows of
 * x times one panel keeps all its sums in vector registers (TILE_ROWS x PANEL_VECS of them): each weight
 * loaded serves TILE_ROWS rows, each element of x loaded (broadcast) serves PANEL columns, and every output is
 * summed over k in order, as a plain dot product would. The threads share out the panels (work_shares.h), so
 * each weight is read from memory once per call.
 *
 * Measured against MKL's sgemm on [in, out] weights (Xeon, AVX-512, the default model's four layer shapes,
 * weights read from memory): the same time at one row (both stream the weights at the memory's rate), 1.7x
 * faster at 8 rows, 1.3x at 64, 1.1x at 128, 1.05x at 256 and 0.93x at 2048 (prefill). On one core of an
 * AMD Zen 3 (AVX2): 1.1-1.2x MKL at 128 rows and 1.0-1.05x at 2048 (86-95 GFLOP/s), and at one row it
 * streams the weights at the rate of a plain sum over them.
 *
 * int8 weights (one scale per output column) and bfloat16 weights convert to float32 as they are loaded, up
 * to CONVERT_ROWS rows (decode: streaming a quarter or half of the bytes is what makes them fast at a few
 * rows, and such a panel stays in the L1 cache for all the tiles of a decode batch); for more rows each panel
 * is converted once into a buffer that stays in the L2 cache and then multiplied like a float32 panel. A
 * bfloat16 weight is the top half of a float32, so widening it is exact and needs no bfloat16 instructions:
 * x and the sums stay float32. AVX512_BF16's dot products, which need no widening (x split into two bfloat16
 * halves), measured 1.15x faster with the weights in cache on an AMD Zen 4 but 1.06x slower streamed from
 * memory, and a cheaper widening (shift and mask of two columns' pairs) 0.98-0.99x: at one row neither the
 * widening nor the multiply-adds bound a bfloat16 step.
 */
#include <immintrin.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

#include "entry.h"
#include "work_shares.h"

#if defined(__AVX512F__)
#define VEC 16       /* floats per vector register */
#define TILE_ROWS 8  /* 8 x 3 sums in 24 of the 32 registers */
#define PANEL_VECS 3
#else
#define VEC 8
/* 6 x 2 sums in 12 of the 16 registers, leaving registers for both weight vectors: with 4 x 3 sums the
 * compiler reloaded each weight vector once per row (16 loads to 12 multiply-adds), and 6 x 2 ran 1.4x
 * faster on one core of an AMD Zen 3 at 128 rows (94 GFLOP/s against 66). One k step of a panel is then
 * one cache line. */
#define TILE_ROWS 6
#define PANEL_VECS 2
#endif
#define PANEL (PANEL_VECS * VEC) /* output columns per panel */
#define CHUNK_ROWS 256 /* rows of x per pass over the panels: a chunk stays in L2 while the panels stream by */
/* Weights streamed from memory are prefetched this far ahead, into L2 (into L1 was 1.2x slower): 1.5x the
 * rate of one int8 row of x, 1.1x for float32 (measured 0.5 to 32 KiB; the hardware prefetchers alone fall
 * short). Non-temporal prefetches, meant to spare the caches that the host work between steps needs, were
 * 1.3x slower at 2 and 8 KiB on an AMD Zen 4 and left that work about as slow; prefetching a tile's first
 * PREFETCH_BYTES at once before its loop measured level for float32 and slower for bfloat16. On a Zen 4 at
 * one row (a decode step's linears against a streaming read beside them, median of 4-5 rounds), a prefetch
 * that runs past a panel's end into the next tile's panels measured level, and 4 and 16 KiB ahead 1.03x and
 * 1.06x slower. */
#define PREFETCH_BYTES 8192
#define SPREAD 8 /* tiles that share the prefetch of the next panel */
/* Past this many rows an int8 panel is converted once into a float32 buffer; up to it, every tile converts
 * as it loads (measured the same at 128 rows, 1.05x faster at 256, 1.1x slower at 64). */
#define CONVERT_ROWS 128

typedef float vec __attribute__((vector_size(VEC * 4), aligned(4)));

int64_t panel_width(void) { return PANEL; }

static inline __attribute__((always_inline)) vec load_f32(const float *p) { return *(const vec *)p; }

static inline __attribute__((always_inline)) vec load_i8(const int8_t *p) {
#if defined(__AVX512F__)
    return (vec)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
#elif defined(__AVX2__)
    return (vec)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
#else
    vec v;
    for (int i = 0; i < VEC; i++) v[i] = p[i];
    return v;
#endif
}

/* bfloat16 bits (the top 16 bits of a float32) widened to float32. */
static inline __attribute__((always_inline)) vec load_bf16(const uint16_t *p) {
#if defined(__AVX512F__)
    return (vec)_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
#elif defined(__AVX2__)
    return (vec)_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
#else
    vec v;
    for (int i = 0; i < VEC; i++) {
        const uint32_t bits = (uint32_t)p[i] << 16;
        __builtin_memcpy(&v[i], &bits, 4);
    }
    return v;
#endif
}

/* The multiply-adds of one step of k of a tile (below). */
#define TILE_STEP(WEIGHT, LOAD)                                                                            \
    for (int p = 0; p < panels; p++) {                                                                     \
        const WEIGHT *w = panel + p * panel_size + k * PANEL;                                              \
        vec weights[PANEL_VECS];                                                                           \
        for (int j = 0; j < PANEL_VECS; j++) weights[j] = LOAD(w + j * VEC);                               \
        for (int r = 0; r < rows; r++) {                                                                   \
            float a = x[r * k_in + k];                                                                     \
            for (int j = 0; j < PANEL_VECS; j++) sums[p * rows + r][j] += a * weights[j];                  \
        }                                                                                                  \
    }

/* rows of x times `panels` neighbouring panels (panel_size weights apart) into out's panels * PANEL columns
 * (rows * panels at most TILE_ROWS, both constants once inlined); each step of k also prefetches `step`
 * bytes from prefetch + k * step in each panel, where prefetch is not null.
 *
 * A `shared` tile is one of several over the same panel (7 rows or more on AVX2): its loop prefetches a
 * line every step, a harmless one where it has nothing to fetch, and takes two steps of k per turn. Without
 * the branches and with half the loop's own instructions, a tile of 3 or 4 rows is no longer held up by them:
 * on one core of an AMD Zen 3 (weights in L3), 7 and 8 rows went from 10.8 and 12.2 to 8.2 and 8.4 cycles a
 * step of k over a panel, and the default model's linears with weights from memory 0.89-0.93x the time at 7
 * to 9 rows. A lone tile keeps the plain loop: the same change made it 1.04-1.08x slower at 4 to 6 rows with
 * weights streamed from memory. */
#define DEFINE_TILE(NAME, WEIGHT, LOAD)                                                                    \
    static inline __attribute__((always_inline)) void NAME(                                                \
        const float *x, const WEIGHT *panel, int64_t panel_size, const float *scales, float *out,          \
        int64_t n_out, int64_t k_in, const char *prefetch, int step, const int rows, const int panels,    \
        int shared) {                                                                                      \
        vec sums[TILE_ROWS][PANEL_VECS]; /* [p * rows + r] */                                              \
        for (int i = 0; i < rows * panels; i++)                                                            \
            for (int j = 0; j < PANEL_VECS; j++) sums[i][j] = (vec){0};                                    \
        if (shared) {                                                                                      \
            if (!prefetch) prefetch = (const char *)panel, step = 0;                                      \
            _Pragma("GCC unroll 2")                                                                        \
            for (int64_t k = 0; k < k_in; k++) {                                                           \
                for (int p = 0; p < panels; p++)                                                           \
                    for (int line = 0; line < PANEL * (int)sizeof(WEIGHT); line += 64)                     \
                        __builtin_prefetch(prefetch + p * panel_size * sizeof(WEIGHT) + k * step + line, 0, 1); \
                TILE_STEP(WEIGHT, LOAD)                                                                    \
            }                                                                                              \
        } else                                                                                             \
            for (int64_t k = 0; k < k_in; k++) {                                                           \
                if (prefetch)                                                                              \
                    for (int p = 0; p < panels; p++)                                                       \
                        for (int line = 0; line < step; line += 64)                                        \
                            __builtin_prefetch(prefetch + p * panel_size * sizeof(WEIGHT) + k * step + line, 0, 1); \
                TILE_STEP(WEIGHT, LOAD)                                                                    \
            }                                                                                              \
        for (int p = 0; p < panels; p++)                                                                   \
            for (int r = 0; r < rows; r++)                                                                 \
                for (int j = 0; j < PANEL_VECS; j++) {                                                     \
                    const int64_t column = p * PANEL + j * VEC;                                            \
                    *(vec *)(out + r * n_out + column) =                                                   \
                        scales ? sums[p * rows + r][j] * load_f32(scales + column) : sums[p * rows + r][j]; \
                }                                                                                          \
    }

DEFINE_TILE(tile_f32, float, load_f32)
DEFINE_TILE(tile_i8, int8_t, load_i8)
DEFINE_TILE(tile_bf16, uint16_t, load_bf16)

/* Panels a tile of this many rows takes at once. Each sum is a chain of dependent multiply-adds, one per
 * step of k; with one or two rows, one panel gives too few chains to cover their latency, so the tile
 * takes neighbouring panels, each streamed on its own (1.3x at one row on one core of an AMD Zen 3). Three
 * rows take two panels too (two streams from memory instead of one; 3 x 2 x 2 sums fit the registers): on an
 * AMD Zen 3, two runs, the default model's linears at three rows went from 1.18-1.31x to 1.03x the time of
 * one row. One or two rows take as many panels as fill a tile's registers (8 and 4 with AVX-512, 6 and 3
 * with AVX2) rather than 4 and 2: more streams read from memory at once. On a 2-core AMD Zen 4 with its
 * memory at 50-60 GB/s, a decode step's linears took 0.89x the time at one row (one core alone 0.93x; int8
 * 0.95x, bfloat16 0.92x) and 0.95x at two; the AVX2 build on the same machine 0.92x and 0.95x; level while
 * other work held the memory near 34 GB/s. Four rows over two panels measured level and stay on one, and so
 * did splitting a thread's share into tiles of equal panel counts (10 as 5 + 5, not 8 + 2; Zen 4, one row). */
#define PANELS_PER_TILE(rows) ((rows) <= 3 ? TILE_ROWS / (rows) : 1)

/* One specialization per row count (and panel count), so that the sums stay in registers. */
#define ROWS_CASE(TILE, shared, n, ...) \
    case n: TILE(__VA_ARGS__, n < TILE_ROWS ? n : TILE_ROWS, 1, shared); break;
#define FOR_ROWS(TILE, shared, rows, ...)                    \
    switch (rows) {                                          \
    ROWS_CASE(TILE, shared, 1, __VA_ARGS__)                  \
    ROWS_CASE(TILE, shared, 2, __VA_ARGS__)                  \
    ROWS_CASE(TILE, shared, 3, __VA_ARGS__)                  \
    ROWS_CASE(TILE, shared, 4, __VA_ARGS__)                  \
    ROWS_CASE(TILE, shared, 5, __VA_ARGS__)                  \
    ROWS_CASE(TILE, shared, 6, __VA_ARGS__)                  \
    ROWS_CASE(TILE, shared, 7, __VA_ARGS__)                  \
    default: TILE(__VA_ARGS__, TILE_ROWS, 1, shared); break; \
    }

/* The same for the row counts that take several panels at once (PANELS_PER_TILE above 1), up to that many:
 * a thread's last panels may be fewer. */
#define PANELS_CASE(TILE, n, p, ...) \
    case (n) * 16 + (p): TILE(__VA_ARGS__, n, p, 0); break;
#if TILE_ROWS >= 8 /* the cases only 8-row tiles have */
#define WIDE_CASES(TILE, ...) \
    PANELS_CASE(TILE, 1, 8, __VA_ARGS__) PANELS_CASE(TILE, 1, 7, __VA_ARGS__) PANELS_CASE(TILE, 2, 4, __VA_ARGS__)
#else
#define WIDE_CASES(TILE, ...)
#endif
#define FOR_PANEL_ROWS(TILE, rows, panels, ...) \
    switch ((rows) * 16 + (panels)) {           \
    WIDE_CASES(TILE, __VA_ARGS__)               \
    PANELS_CASE(TILE, 1, 6, __VA_ARGS__)        \
    PANELS_CASE(TILE, 1, 5, __VA_ARGS__)        \
    PANELS_CASE(TILE, 1, 4, __VA_ARGS__)        \
    PANELS_CASE(TILE, 1, 3, __VA_ARGS__)        \
    PANELS_CASE(TILE, 1, 2, __VA_ARGS__)        \
    PANELS_CASE(TILE, 2, 3, __VA_ARGS__)        \
    PANELS_CASE(TILE, 2, 2, __VA_ARGS__)        \
    PANELS_CASE(TILE, 3, 2, __VA_ARGS__)        \
    }

/* Rows [start, end) of x times `panels` neighbouring panels (panel_size weights apart), whose weights were read
 * from `source` (row_bytes per step of k): in one tile where the rows take several panels at once
 * (PANELS_PER_TILE, or fewer where fewer are left), else panel by panel. The tiles prefetch the panel after it,
 * spread over the first SPREAD tiles so that its fetch overlaps their arithmetic (measured 1.25x at 64 rows); a
 * single tile, which streams its own panels, prefetches PREFETCH_BYTES ahead in each. Where a panel is shorter
 * than twice that (int8 panels are 9 KiB on AVX2), that would land in the neighbouring panel, which the tile is
 * reading at that moment: such a tile prefetches the same panel of the next tile instead (at one row on an AMD
 * Zen 3, the default model's int8 LM head from 28 to 32 GB/s; float32 panels, 36 KiB, read 6% slower so in one
 * comparison and keep PREFETCH_BYTES). */
#define DEFINE_PANEL_ROWS(NAME, TILE, WEIGHT)                                                                \
    static void NAME(const float *x, const WEIGHT *panel, int64_t panel_size, int64_t panels,                \
                     const float *scales, float *out, int64_t start, int64_t end, int64_t n_out, int64_t k_in, \
                     const char *source, int row_bytes) {                                                    \
        const int64_t rows = end - start;                                                                    \
        if (panels > 1 && panels <= PANELS_PER_TILE(rows)) {                                                 \
            const int64_t panel_bytes = panel_size * sizeof(WEIGHT);                                         \
            const char *ahead =                                                                              \
                source + (panel_bytes < 2 * PREFETCH_BYTES ? panels * panel_bytes : PREFETCH_BYTES);         \
            FOR_PANEL_ROWS(TILE, rows, panels, x + start * k_in, panel, panel_size, scales, out + start * n_out, n_out, \
                           k_in, ahead, row_bytes)                                                           \
            return;                                                                                          \
        }                                                                                                    \
        int64_t tiles = (rows + TILE_ROWS - 1) / TILE_ROWS, spread = tiles < SPREAD ? tiles : SPREAD;        \
        /* Tiles as even as can be, sizes one apart: 8 rows as 4 and 4, not 6 and 2; 128 as 18 tiles of 6 and 4   \
         * of 5, not 21 of 6 and one of 2, whose 4 sums in flight cannot keep the multiply-adds busy. */        \
        const int64_t small = rows / tiles, large = rows % tiles; /* the first `large` take a row more */    \
        int step = (row_bytes + spread - 1) / spread;                                                        \
        for (int64_t p = 0; p < panels; p++) {                                                               \
            const WEIGHT *one = panel + p * panel_size;                                                      \
            const char *from = source + p * panel_size * sizeof(WEIGHT);                                     \
            const float *one_scales = scales ? scales + p * PANEL : 0;                                       \
            for (int64_t m = start, t = 0; t < tiles; m += small + (t < large), t++) {                       \
                const int tile_rows = small + (t < large);                                                   \
                const char *prefetch = tiles == 1 ? from + PREFETCH_BYTES                                    \
                                       : t < spread ? from + (row_bytes + t * step) * k_in : 0;              \
                FOR_ROWS(TILE, tiles > 1, tile_rows, x + m * k_in, one, panel_size, one_scales,              \
                         out + m * n_out + p * PANEL, n_out, k_in, prefetch, step)                           \
            }                                                                                                \
        }                                                                                                    \
    }

DEFINE_PANEL_ROWS(panel_rows_f32, tile_f32, float)
DEFINE_PANEL_ROWS(panel_rows_i8, tile_i8, int8_t)
DEFINE_PANEL_ROWS(panel_rows_bf16, tile_bf16, uint16_t)

/* The row chunks of a call and the work shares (work_shares.h) of each chunk's panels, one per thread: a chunk's
 * panels are done before the next chunk's, so that its rows stay in the cache while the panels stream by. */
static int64_t row_chunks(int64_t rows) { return (rows + CHUNK_ROWS - 1) / CHUNK_ROWS; }

static work_share *panel_shares(int64_t rows, int64_t panels, int64_t threads) {
    work_share *shares = work_shares(row_chunks(rows) * threads);
    for (int64_t c = 0; c < row_chunks(rows); c++) work_shares_init(shares + c * threads, threads, panels);
    return shares;
}

void packed_linear_f32(const float *x, const float *w, float *out, int64_t rows, int64_t n_out, int64_t k_in) {
    const int64_t panels = n_out / PANEL, panel_size = PANEL * k_in, threads = omp_get_max_threads();
    work_share *shares = panel_shares(rows, panels, threads);
#pragma omp parallel
    for (int64_t c = 0; c < row_chunks(rows); c++) {
        const int64_t start = c * CHUNK_ROWS, end = start + CHUNK_ROWS < rows ? start + CHUNK_ROWS : rows;
        int64_t p, taken;
        while ((p = work_shares_next(shares + c * threads, threads, omp_get_thread_num(),
                                     PANELS_PER_TILE(end - start), &taken)) >= 0)
            panel_rows_f32(x, w + p * panel_size, panel_size, taken, 0, out + p * PANEL, start, end, n_out, k_in,
                           (const char *)(w + p * panel_size), sizeof(float) * PANEL);
    }
}

/* This thread's scratch space of at least `floats`, kept between calls: a fresh allocation of this size
 * would be mapped anew, and its pages faulted in, on every call. */
static float *thread_buffer(int64_t floats) {
    static __thread float *buffer;
    static __thread int64_t capacity;
    if (capacity < floats) {
        free(buffer);
        buffer = malloc(sizeof(float) * floats);
        capacity = floats;
    }
    return buffer;
}

/* A linear layer over weights that convert to float32 as they load (int8 with scales, or bfloat16 with none):
 * converted tile by tile up to CONVERT_ROWS rows, else panel by panel into a float32 buffer. */
#define DEFINE_CONVERTING_LINEAR(NAME, WEIGHT, LOAD, PANEL_ROWS)                                              \
    static void NAME(const float *x, const WEIGHT *w, const float *scales, float *out, int64_t rows,         \
                     int64_t n_out, int64_t k_in) {                                                          \
        const int64_t panels = n_out / PANEL, panel_size = PANEL * k_in, threads = omp_get_max_threads();   \
        work_share *shares = panel_shares(rows, panels, threads);                                            \
        _Pragma("omp parallel") {                                                                            \
            float *converted = rows > CONVERT_ROWS ? thread_buffer(panel_size) : 0;                          \
            for (int64_t c = 0; c < row_chunks(rows); c++) {                                                 \
                const int64_t start = c * CHUNK_ROWS, end = start + CHUNK_ROWS < rows ? start + CHUNK_ROWS : rows; \
                int64_t p, taken;                                                                            \
                while ((p = work_shares_next(shares + c * threads, threads, omp_get_thread_num(),            \
                                             converted ? 1 : PANELS_PER_TILE(end - start), &taken)) >= 0) {  \
                    const WEIGHT *panel = w + p * panel_size;                                                \
                    const float *panel_scales = scales ? scales + p * PANEL : 0;                             \
                    if (!converted) {                                                                        \
                        PANEL_ROWS(x, panel, panel_size, taken, panel_scales, out + p * PANEL, start, end,   \
                                   n_out, k_in, (const char *)panel, sizeof(WEIGHT) * PANEL);                \
                        continue;                                                                            \
                    }                                                                                        \
                    for (int64_t i = 0; i < panel_size; i += VEC) *(vec *)(converted + i) = LOAD(panel + i); \
                    panel_rows_f32(x, converted, panel_size, 1, panel_scales, out + p * PANEL, start, end,   \
                                   n_out, k_in, (const char *)panel, sizeof(WEIGHT) * PANEL);                \
                }                                                                                            \
            }                                                                                                \
        }                                                                                                    \
    }

DEFINE_CONVERTING_LINEAR(converting_linear_i8, int8_t, load_i8, panel_rows_i8)
DEFINE_CONVERTING_LINEAR(converting_linear_bf16, uint16_t, load_bf16, panel_rows_bf16)

void packed_linear_i8(const float *x, const int8_t *w, const float *scales, float *out, int64_t rows,
                      int64_t n_out, int64_t k_in) {
    converting_linear_i8(x, w, scales, out, rows, n_out, k_in);
}

void packed_linear_bf16(const float *x, const uint16_t *w, float *out, int64_t rows, int64_t n_out, int64_t k_in) {
    converting_linear_bf16(x, w, 0, out, rows, n_out, k_in);
}

/* Weights stored in blocks of BLOCK_K steps of k, as a GGUF file stores its Q4_1 and Q8_0 tensors: where every
 * float32 weight of a layer is exactly d * q + m (4-bit q, float16 d and m per block of an output column) or
 * d * q (8-bit q), weight_blocks.py packs it so, and the kernel decodes each weight to that same float32 value
 * as it streams it: an output is then summed over the same float32 weights in the same order as from float32
 * panels, bit for bit, from a fifth (4-bit) or a quarter (8-bit) of the bytes. d * q is exact in float32 (11
 * and at most 8 significant bits), so d * q + m rounds once, as the float32 dequantization does.
 *
 * A panel's blocks lie one after another, each its PANEL scales d (float16), for 4-bit blocks its PANEL
 * offsets m (float16), then its codes: per step of k (per pair of steps for 4-bit codes, the first in the low
 * half of each byte) the PANEL codes of the panel's columns. Up to DIRECT_ROWS rows, each panel is decoded as
 * its tiles multiply it (each tile at most BLOCK_ROWS rows, decoding it anew); for more, it is decoded once into
 * a float32 buffer that stays in the L2 cache and multiplied as a float32 panel.
 *
 * Summing each block as d * (x . q) + m * (sum of x) instead, llama.cpp's order, takes one multiply-add a weight
 * fewer: measured on an AMD Zen 4, the default model's linears took 0.89x the time at one row, 0.91x at two and
 * 0.88x at six, but 1.08-1.15x at 32 to 128 rows, where the multiply-adds bound the step and each block adds its
 * own. A request's outputs must not depend on the rows beside it, so every row count would sum that way: decoding
 * stays the float32 weights' sum. */
#if defined(__AVX2__) && defined(__F16C__)
#define BLOCK_K 32
#define Q4_BLOCK_BYTES (20 * PANEL) /* PANEL d and m (2 bytes each), 16 pairs of steps of PANEL codes */
#define Q8_BLOCK_BYTES (34 * PANEL) /* PANEL d, 32 steps of PANEL codes */
/* Rows decoded as the tile multiplies: their sums leave registers for the decoded weights (on an AMD Zen 4, a
 * decode step's linears at 5 and 6 rows 0.70x and 0.82x the time of decoding each panel once into a buffer,
 * at 7 rows level, at 8 rows 1.18x; the AVX2 build, run there, level at 4 rows). */
#define BLOCK_ROWS (TILE_ROWS - 2)
/* Whether each block of a direct tile prefetches its panel PREFETCH_BYTES ahead. With AVX2 on a 2-core AMD Zen 3
 * (interleaved with the kernel without it, benchmarks/block_kernels.py --baseline, seven invocations), a one-row
 * decode step's 4-bit layers took 0.90-0.97x the time in six (1.01x in the seventh), two to six rows 0.85-1.03x;
 * the default model's Q8_0 LM head at one row 0.77-0.95x in four. The layers there are bound by the multiply-adds
 * (two a weight vector: its decoding and its product), about 11 G weights a second per core whether they come
 * from memory or from the L3 cache, and huge pages for them measured level. With AVX-512 on an AMD Zen 4 it
 * measured level or slower. */
#if defined(__AVX512F__)
#define BLOCK_PREFETCH 0
#else
#define BLOCK_PREFETCH 1
#endif
/* Rows done as tiles that each decode the panel anew, not through the buffer: on an AMD Zen 4, the default model's
 * linears took 0.82-0.85x the time at 7 and 8 rows (two tiles) and 0.93x at 10, but 1.12x at 12 and 16; the
 * AVX2 build, run there, 0.84-0.88x at 5 rows, level at 6, 1.12-1.2x at 7 and 8. Outputs are the same either way. */
#if defined(__AVX512F__)
#define DIRECT_ROWS 10
#else
#define DIRECT_ROWS 6
#endif

#if defined(__AVX512F__)
typedef __m512i ivec; /* VEC 32-bit integers */
#else
typedef __m256i ivec;
#endif

static inline __attribute__((always_inline)) vec load_f16(const uint16_t *p) {
#if defined(__AVX512F__)
    return (vec)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
#else
    return (vec)_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
#endif
}

/* VEC bytes, each widened to a 32-bit integer. */
static inline __attribute__((always_inline)) ivec load_u8(const uint8_t *p) {
#if defined(__AVX512F__)
    return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
#else
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
#endif
}

/* The low 4 bits of each lane as a float. With AVX-512, a lookup in a table of 0 to 15, which reads only those
 * bits (a decode step's linears 0.93-0.95x the time of masking and converting, at one row on an AMD Zen 4). */
static inline __attribute__((always_inline)) vec low_nibbles(ivec c) {
#if defined(__AVX512F__)
    return (vec)_mm512_permutexvar_ps(c, _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
#else
    return (vec)_mm256_cvtepi32_ps(_mm256_and_si256(c, _mm256_set1_epi32(15)));
#endif
}

/* Bits 4 to 7 of each lane (the rest are zero) as a float. */
static inline __attribute__((always_inline)) vec high_nibbles(ivec c) {
#if defined(__AVX512F__)
    return (vec)_mm512_cvtepi32_ps(_mm512_srli_epi32(c, 4));
#else
    return (vec)_mm256_cvtepi32_ps(_mm256_srli_epi32(c, 4));
#endif
}

/* sum + a * w, rounded once. */
static inline __attribute__((always_inline)) vec multiply_add(float a, vec w, vec sum) {
#if defined(__AVX512F__)
    return (vec)_mm512_fmadd_ps(_mm512_set1_ps(a), (__m512)w, (__m512)sum);
#else
    return (vec)_mm256_fmadd_ps(_mm256_set1_ps(a), (__m256)w, (__m256)sum);
#endif
}

int64_t block_formats(void) { return 1; }

/* Calls EMIT(k, j, w) for each weight vector w (column vector j, step k from the block's first) of a block, in
 * order of k: the one place that knows how each format decodes. */
#define FOR_Q4_WEIGHTS(block, EMIT)                                                                        \
    {                                                                                                      \
        const uint16_t *scale = (const uint16_t *)(block), *offset = scale + PANEL;                        \
        const uint8_t *codes = (const uint8_t *)(block) + 4 * PANEL;                                       \
        vec d[PANEL_VECS], m[PANEL_VECS];                                                                  \
        for (int j = 0; j < PANEL_VECS; j++) d[j] = load_f16(scale + j * VEC), m[j] = load_f16(offset + j * VEC); \
        for (int i = 0; i < BLOCK_K / 2; i++)                                                              \
            for (int j = 0; j < PANEL_VECS; j++) {                                                         \
                const ivec c = load_u8(codes + i * PANEL + j * VEC);                                       \
                EMIT(2 * i, j, d[j] * low_nibbles(c) + m[j])                                               \
                EMIT(2 * i + 1, j, d[j] * high_nibbles(c) + m[j])                                          \
            }                                                                                              \
    }
#define FOR_Q8_WEIGHTS(block, EMIT)                                                                        \
    {                                                                                                      \
        const uint16_t *scale = (const uint16_t *)(block);                                                 \
        const int8_t *codes = (const int8_t *)(block) + 2 * PANEL;                                         \
        vec d[PANEL_VECS];                                                                                 \
        for (int j = 0; j < PANEL_VECS; j++) d[j] = load_f16(scale + j * VEC);                             \
        for (int i = 0; i < BLOCK_K; i++)                                                                  \
            for (int j = 0; j < PANEL_VECS; j++) EMIT(i, j, d[j] * load_i8(codes + i * PANEL + j * VEC))         \
    }

/* rows (at most BLOCK_ROWS) of x times one panel of blocks into out's PANEL columns; each weight, decoded, is
 * added into each row's sum as tile_f32 adds it, by an explicit multiply-add (written as a sum, -ffast-math let
 * the compiler regroup the two steps a code byte holds, and the sums differed in their last bits). */
#define ADD_TO_SUMS(k, j, w)                                                                               \
    {                                                                                                      \
        const vec weight = (w);                                                                            \
        for (int r = 0; r < rows; r++) sums[r][j] = multiply_add(x[r * k_in + first + (k)], weight, sums[r][j]); \
    }
#define DEFINE_BLOCK_TILE(NAME, BLOCK_BYTES, FOR_WEIGHTS)                                                  \
    static inline __attribute__((always_inline)) void NAME(const float *x, const uint8_t *panel, float *out, \
                                                           int64_t n_out, int64_t k_in, const int rows) {  \
        vec sums[BLOCK_ROWS][PANEL_VECS];                                                                  \
        for (int r = 0; r < rows; r++)                                                                     \
            for (int j = 0; j < PANEL_VECS; j++) sums[r][j] = (vec){0};                                    \
        for (int64_t first = 0; first < k_in; first += BLOCK_K) {                                          \
            const uint8_t *block = panel + first / BLOCK_K * (BLOCK_BYTES);                                \
            if (BLOCK_PREFETCH)                                                                            \
                for (int line = 0; line < (BLOCK_BYTES); line += 64)                                       \
                    __builtin_prefetch(block + line + PREFETCH_BYTES, 0, 1);                               \
            FOR_WEIGHTS(block, ADD_TO_SUMS)                                                                \
        }                                                                                                  \
        for (int r = 0; r < rows; r++)                                                                     \
            for (int j = 0; j < PANEL_VECS; j++) *(vec *)(out + r * n_out + j * VEC) = sums[r][j];         \
    }
DEFINE_BLOCK_TILE(tile_q4, Q4_BLOCK_BYTES, FOR_Q4_WEIGHTS)
DEFINE_BLOCK_TILE(tile_q8, Q8_BLOCK_BYTES, FOR_Q8_WEIGHTS)

/* A panel of blocks decoded into a float32 panel [k_in][PANEL]. */
#define STORE_WEIGHT(k, j, w) *(vec *)(decoded + (first + (k)) * PANEL + (j) * VEC) = (w);
#define DEFINE_DECODE_PANEL(NAME, BLOCK_BYTES, FOR_WEIGHTS)                                                \
    static void NAME(const uint8_t *panel, float *decoded, int64_t k_in) {                                 \
        for (int64_t first = 0; first < k_in; first += BLOCK_K)                                            \
            FOR_WEIGHTS(panel + first / BLOCK_K * (BLOCK_BYTES), STORE_WEIGHT)                             \
    }
DEFINE_DECODE_PANEL(decode_q4, Q4_BLOCK_BYTES, FOR_Q4_WEIGHTS)
DEFINE_DECODE_PANEL(decode_q8, Q8_BLOCK_BYTES, FOR_Q8_WEIGHTS)

/* One specialization per tile size (as FOR_ROWS), up to BLOCK_ROWS. */
#define BLOCK_ROWS_CASE(TILE, n, ...) case n: TILE(__VA_ARGS__, n < BLOCK_ROWS ? n : BLOCK_ROWS); break;
#define FOR_BLOCK_ROWS(TILE, rows, ...)       \
    switch (rows) {                           \
    BLOCK_ROWS_CASE(TILE, 1, __VA_ARGS__)     \
    BLOCK_ROWS_CASE(TILE, 2, __VA_ARGS__)     \
    BLOCK_ROWS_CASE(TILE, 3, __VA_ARGS__)     \
    BLOCK_ROWS_CASE(TILE, 4, __VA_ARGS__)     \
    BLOCK_ROWS_CASE(TILE, 5, __VA_ARGS__)     \
    BLOCK_ROWS_CASE(TILE, 6, __VA_ARGS__)     \
    }
#define DEFINE_BLOCK_LINEAR(NAME, BLOCK_BYTES, TILE, DECODE)                                               \
    static void NAME(const float *x, const uint8_t *w, float *out, int64_t rows, int64_t n_out, int64_t k_in) { \
        const int64_t panels = n_out / PANEL, panel_bytes = k_in / BLOCK_K * (BLOCK_BYTES);                \
        const int64_t threads = omp_get_max_threads();                                                     \
        /* Direct tiles (rows <= DIRECT_ROWS: one chunk) as even as can be, sizes one apart, as panel_rows'. */ \
        const int64_t tiles = (rows + BLOCK_ROWS - 1) / BLOCK_ROWS, small = rows / tiles, large = rows % tiles; \
        work_share *shares = panel_shares(rows, panels, threads);                                          \
        _Pragma("omp parallel") {                                                                          \
            float *decoded = rows > DIRECT_ROWS ? thread_buffer(PANEL * k_in) : 0;                         \
            for (int64_t c = 0; c < row_chunks(rows); c++) {                                               \
                const int64_t start = c * CHUNK_ROWS, end = start + CHUNK_ROWS < rows ? start + CHUNK_ROWS : rows; \
                int64_t p, taken;                                                                          \
                while ((p = work_shares_next(shares + c * threads, threads, omp_get_thread_num(), 1, &taken)) >= 0) { \
                    const uint8_t *panel = w + p * panel_bytes;                                            \
                    if (!decoded) {                                                                        \
                        for (int64_t m = 0, t = 0; t < tiles; m += small + (t < large), t++)               \
                            FOR_BLOCK_ROWS(TILE, small + (t < large), x + m * k_in, panel,                 \
                                           out + m * n_out + p * PANEL, n_out, k_in)                       \
                        continue;                                                                          \
                    }                                                                                      \
                    DECODE(panel, decoded, k_in);                                                          \
                    panel_rows_f32(x, decoded, PANEL * k_in, 1, 0, out + p * PANEL, start, end, n_out, k_in, \
                                   (const char *)panel, (BLOCK_BYTES) / BLOCK_K);                          \
                }                                                                                          \
            }                                                                                              \
        }                                                                                                  \
    }
DEFINE_BLOCK_LINEAR(block_linear_q4, Q4_BLOCK_BYTES, tile_q4, decode_q4)
DEFINE_BLOCK_LINEAR(block_linear_q8, Q8_BLOCK_BYTES, tile_q8, decode_q8)

/* 4-bit blocks times inputs rounded to bfloat16 (dtype=bfloat16), with AVX512_BF16's dot products: each product
 * of a bfloat16 input and a 4-bit code is exact in float32, and a block sums as d * (x . q) + m * (sum of x), the
 * sums float32. One instruction takes two steps of k of VEC columns, so a row costs one instruction per 32
 * weights, where float32 takes two multiply-adds and the weights' decoding. The codes are laid out for it
 * (weight_blocks.py): per group of four step pairs, a 32-bit word per column holding pair s's codes at bits 4 s
 * and 16 + 4 s, so that a shift and one bitwise operation give the pair as two bfloat16 words 128 + q (exponent 7,
 * the code in the low mantissa bits); m - 128 d takes the 128 back. Each row's sums take the same steps whatever
 * the rows beside it.
 *
 * A decode step's 120 4-bit layers of the default model's shapes, replayed from memory on an AMD Zen 4
 * (benchmarks/block_kernels.py): 0.83x the time of float32 products at one row (1.24x a plain streaming read of
 * their 66 MB, against 1.49x), 0.52-0.53x at 4 and 8 rows, 0.63x at 64, 0.72x at 256 (where each dot product
 * instruction takes about a cycle, as a multiply-add does, and a block's scaling adds two multiply-adds to its 16).
 * In a decode step of the engine, a one-row replay of the 30 layers (linears, attention and element-wise
 * steps) took 3.0-3.4 ms against 3.6-3.7 ms. */
#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#define BF16_TILE_ROWS 12 /* 12 rows by one column vector: 24 sums in registers */
/* One row takes two panels at once: three and four measured level at one row (a decode step's layers, AMD Zen 4). */
#define BF16_ONE_ROW_PANELS 2
#define BF16_TILE_VECTORS (BF16_ONE_ROW_PANELS * PANEL_VECS)

int64_t bf16_block_formats(void) { return 1; }

/* rows (at most BF16_TILE_ROWS) of bfloat16 pairs xp [rows][k_in / 2] with their block sums xs [rows][k_in /
 * BLOCK_K], times `vectors` column vectors of 4-bit blocks, from vector `first` of the panel at w on (PANEL_VECS
 * a panel, panels panel_bytes apart), into out's columns of those vectors. */
static inline __attribute__((always_inline)) void tile_q4_bf16(const uint32_t *xp, const float *xs,
                                                                const uint8_t *w, int64_t panel_bytes, float *out,
                                                                int64_t n_out, int64_t k_in, const int rows,
                                                                const int vectors, const int first) {
    __m512 sums[BF16_TILE_ROWS][BF16_TILE_VECTORS], dots[BF16_TILE_ROWS][BF16_TILE_VECTORS];
    const int64_t pairs = k_in / 2, blocks = k_in / BLOCK_K;
    const uint8_t *base[BF16_TILE_VECTORS];
    int column[BF16_TILE_VECTORS]; /* of the vector within its panel */
    for (int v = 0; v < vectors; v++) {
        base[v] = w + (first + v) / PANEL_VECS * panel_bytes;
        column[v] = (first + v) % PANEL_VECS * VEC;
        for (int r = 0; r < rows; r++) sums[r][v] = _mm512_setzero_ps();
    }
    for (int64_t b = 0; b < blocks; b++, xp += BLOCK_K / 2) {
        for (int r = 0; r < rows; r++)
            for (int v = 0; v < vectors; v++) dots[r][v] = _mm512_setzero_ps();
        for (int g = 0; g < BLOCK_K / 8; g++) {
            __m512i codes[BF16_TILE_VECTORS];
            for (int v = 0; v < vectors; v += PANEL_VECS)
                for (int line = 0; line < Q4_BLOCK_BYTES / 4; line += 64)
                    __builtin_prefetch(base[v] + (b * 4 + g) * (Q4_BLOCK_BYTES / 4) + line + PREFETCH_BYTES, 0, 1);
            for (int v = 0; v < vectors; v++)
                codes[v] =
                    _mm512_loadu_si512(base[v] + b * Q4_BLOCK_BYTES + 4 * PANEL + (g * PANEL + column[v]) * 4);
            for (int s = 0; s < 4; s++)
                for (int v = 0; v < vectors; v++) {
                    const __m512bh q = (__m512bh)_mm512_ternarylogic_epi32(_mm512_srli_epi32(codes[v], 4 * s),
                        _mm512_set1_epi32(0x000f000f), _mm512_set1_epi32(0x43004300), 0xea);
                    for (int r = 0; r < rows; r++) {
                        const __m512bh x_pair = (__m512bh)_mm512_set1_epi32((int)xp[r * pairs + 4 * g + s]);
                        dots[r][v] = _mm512_dpbf16_ps(dots[r][v], q, x_pair);
                    }
                }
        }
        for (int v = 0; v < vectors; v++) {
            const uint16_t *scale = (const uint16_t *)(base[v] + b * Q4_BLOCK_BYTES) + column[v];
            const __m512 d = (__m512)load_f16(scale);
            const __m512 offset = _mm512_fmadd_ps(d, _mm512_set1_ps(-128), (__m512)load_f16(scale + PANEL));
            for (int r = 0; r < rows; r++) {
                sums[r][v] = _mm512_fmadd_ps(d, dots[r][v], sums[r][v]);
                sums[r][v] = _mm512_fmadd_ps(offset, _mm512_set1_ps(xs[r * blocks + b]), sums[r][v]);
            }
        }
    }
    for (int v = 0; v < vectors; v++)
        for (int r = 0; r < rows; r++)
            _mm512_storeu_ps(out + r * n_out + (first + v) / PANEL_VECS * PANEL + column[v], sums[r][v]);
}

/* Each row of x rounded to bfloat16 (to nearest even), as pairs, and the float32 sum of each block of it. */
static void round_rows_bf16(const float *x, uint32_t *xp, float *xs, int64_t rows, int64_t k_in) {
#pragma omp for
    for (int64_t r = 0; r < rows; r++)
        for (int64_t b = 0; b < k_in / BLOCK_K; b++) {
            const float *from = x + r * k_in + b * BLOCK_K;
            const __m512bh rounded = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(from + 16), _mm512_loadu_ps(from));
            _mm512_storeu_si512(xp + (r * k_in + b * BLOCK_K) / 2, (__m512i)rounded);
            const __m512i words = (__m512i)rounded;
            const __m512 low = _mm512_castsi512_ps(_mm512_slli_epi32(words, 16));
            const __m512 high = _mm512_castsi512_ps(_mm512_and_si512(words, _mm512_set1_epi32((int)0xffff0000)));
            xs[r * (k_in / BLOCK_K) + b] = _mm512_reduce_add_ps(_mm512_add_ps(low, high));
        }
}

/* This thread's scratch space for a call's rounded rows, kept between calls (as thread_buffer). */
static void *rounded_rows_buffer(int64_t bytes) {
    static __thread void *buffer;
    static __thread int64_t capacity;
    if (capacity < bytes) {
        free(buffer);
        buffer = malloc(bytes);
        capacity = bytes;
    }
    return buffer;
}

/* One tile of `rows` rows by `vectors` column vectors, each shape its own specialization (sums in registers):
 * one row takes two panels' six vectors (six chains of dot products to cover their latency), two to four rows
 * a panel's three, more rows one vector at a time. */
#define BF16_TILE_CASE(n, v) \
    case (n) * 16 + (v): tile_q4_bf16(xp, xs, w, panel_bytes, out, n_out, k_in, n, v, first); break;
static void bf16_tile(const uint32_t *xp, const float *xs, const uint8_t *w, int64_t panel_bytes, float *out,
                      int64_t n_out, int64_t k_in, int rows, int vectors, int first) {
    switch (rows * 16 + vectors) {
    BF16_TILE_CASE(1, 6) BF16_TILE_CASE(1, 3) BF16_TILE_CASE(2, 3) BF16_TILE_CASE(3, 3) BF16_TILE_CASE(4, 3)
    BF16_TILE_CASE(5, 1) BF16_TILE_CASE(6, 1) BF16_TILE_CASE(7, 1) BF16_TILE_CASE(8, 1) BF16_TILE_CASE(9, 1)
    BF16_TILE_CASE(10, 1) BF16_TILE_CASE(11, 1) BF16_TILE_CASE(12, 1)
    default: abort();
    }
}

/* x [rows, k_in] rounded to bfloat16 times a weight in 4-bit blocks packed for bfloat16 inputs (weight_blocks.py),
 * [n_out / PANEL, k_in / BLOCK_K, block_bytes]. */
void packed_linear_blocks_bf16(const float *x, const uint8_t *w, float *out, int64_t rows, int64_t n_out,
                               int64_t k_in, int64_t block_bytes) {
    if (block_bytes != Q4_BLOCK_BYTES)
        abort(); /* layers.py takes 4-bit blocks only to this kernel */
    const int64_t panels = n_out / PANEL, panel_bytes = k_in / BLOCK_K * Q4_BLOCK_BYTES;
    const int64_t threads = omp_get_max_threads(), pairs = k_in / 2, blocks = k_in / BLOCK_K;
    char *scratch = rounded_rows_buffer(rows * (pairs + blocks) * 4);
    uint32_t *xp = (uint32_t *)scratch;
    float *xs = (float *)(scratch + rows * pairs * 4);
    work_share *shares = panel_shares(rows, panels, threads);
#pragma omp parallel
    {
        round_rows_bf16(x, xp, xs, rows, k_in); /* ends in a barrier */
        for (int64_t c = 0; c < row_chunks(rows); c++) {
            const int64_t start = c * CHUNK_ROWS, end = start + CHUNK_ROWS < rows ? start + CHUNK_ROWS : rows;
            int64_t p, taken;
            const int64_t most = end - start == 1 ? BF16_ONE_ROW_PANELS : 1;
            while ((p = work_shares_next(shares + c * threads, threads, omp_get_thread_num(), most, &taken)) >= 0) {
                const uint8_t *panel = w + p * panel_bytes;
                if (end - start <= 4) {
                    bf16_tile(xp + start * pairs, xs + start * blocks, panel, panel_bytes,
                              out + start * n_out + p * PANEL, n_out, k_in, end - start, taken * PANEL_VECS, 0);
                    continue;
                }
                /* Tiles as even as can be, sizes one apart (as panel_rows'). */
                const int64_t tiles = (end - start + BF16_TILE_ROWS - 1) / BF16_TILE_ROWS;
                const int64_t small = (end - start) / tiles, large = (end - start) % tiles;
                for (int j = 0; j < PANEL_VECS; j++)
                    for (int64_t m = start, t = 0; t < tiles; m += small + (t < large), t++)
                        bf16_tile(xp + m * pairs, xs + m * blocks, panel, panel_bytes, out + m * n_out + p * PANEL,
                                  n_out, k_in, small + (t < large), 1, j);
            }
        }
    }
}
#endif

/* One row x times panel p of a weight packed in blocks of block_bytes, into out's PANEL columns. */
static void block_panel_row(const float *x, const uint8_t *w, int64_t p, int64_t k_in, int64_t block_bytes,
                            float *out) {
    const uint8_t *panel = w + p * (k_in / BLOCK_K) * block_bytes;
    if (block_bytes == Q4_BLOCK_BYTES)
        tile_q4(x, panel, out, PANEL, k_in, 1);
    else
        tile_q8(x, panel, out, PANEL, k_in, 1);
}

/* x [rows, k_in] times a weight [n_out, k_in] packed as [n_out / PANEL, k_in / BLOCK_K, block_bytes]: 4-bit
 * blocks where block_bytes is Q4_BLOCK_BYTES, else 8-bit ones. */
void packed_linear_blocks(const float *x, const uint8_t *w, float *out, int64_t rows, int64_t n_out, int64_t k_in,
                          int64_t block_bytes) {
    (block_bytes == Q4_BLOCK_BYTES ? block_linear_q4 : block_linear_q8)(x, w, out, rows, n_out, k_in);
}
#else
int64_t block_formats(void) { return 0; }

void packed_linear_blocks(const float *x, const uint8_t *w, float *out, int64_t rows, int64_t n_out, int64_t k_in,
                          int64_t block_bytes) {
    abort(); /* block_formats() says there are none: weight_blocks.py packs no weight so */
}

static void block_panel_row(const float *x, const uint8_t *w, int64_t p, int64_t k_in, int64_t block_bytes,
                            float *out) {
    abort();
}
#endif

/* One row x times panel p of a weight packed in float32 panels (block_bytes 0) or in blocks (packed_linear_blocks'
 * block_bytes), into out's PANEL columns: the values a call of the layer gives those columns, bit for bit, since
 * each output is one sum over k in order whatever the rows and panels beside it. greedy_head.c computes the
 * panels it cannot rule out so. */
void packed_panel_row(const float *x, const void *w, int64_t p, int64_t k_in, int64_t block_bytes, float *out) {
    if (block_bytes)
        block_panel_row(x, w, p, k_in, block_bytes, out);
    else
        tile_f32(x, (const float *)w + p * PANEL * k_in, PANEL * k_in, 0, out, PANEL, k_in, 0, 0, 1, 1, 0);
}

#if !(defined(__AVX2__) && defined(__F16C__) && defined(__AVX512BF16__) && defined(__AVX512BW__))
int64_t bf16_block_formats(void) { return 0; }

void packed_linear_blocks_bf16(const float *x, const uint8_t *w, float *out, int64_t rows, int64_t n_out,
                               int64_t k_in, int64_t block_bytes) {
    abort(); /* bf16_block_formats() says there is none: layers.py packs no weight for it */
}
#endif

void packed_linear_blocks_bf16_entry(const int64_t *args) {
    packed_linear_blocks_bf16(ARG(0, const float *), ARG(1, const uint8_t *), ARG(2, float *), args[3], args[4],
                              args[5], args[6]);
}

void packed_linear_blocks_entry(const int64_t *args) {
    packed_linear_blocks(ARG(0, const float *), ARG(1, const uint8_t *), ARG(2, float *), args[3], args[4], args[5],
                         args[6]);
}

void packed_linear_f32_entry(const int64_t *args) {
    packed_linear_f32(ARG(0, const float *), ARG(1, const float *), ARG(2, float *), args[3], args[4], args[5]);
}

void packed_linear_i8_entry(const int64_t *args) {
    packed_linear_i8(ARG(0, const float *), ARG(1, const int8_t *), ARG(2, const float *), ARG(3, float *), args[4],
                     args[5], args[6]);
}

void packed_linear_bf16_entry(const int64_t *args) {
    packed_linear_bf16(ARG(0, const float *), ARG(1, const uint16_t *), ARG(2, float *), args[3], args[4], args[5]);
}
