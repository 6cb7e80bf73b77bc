/* Linear layers on CPU over weights packed in panels: out[m][n] = x[m] . w[n] (times scales[n] for int8).
 *
 * The weight [n_out, k_in] is stored as panels of PANEL output columns, each panel [k_in][PANEL]
 * contiguous, so that one step of k reads one short contiguous row of the panel. A tile of TILE_ROWS rows of
 * x times one panel keeps all its sums in vector registers (TILE_ROWS x PANEL_VECS of them): each weight
 * loaded serves TILE_ROWS rows, each element of x loaded (broadcast) serves PANEL columns, and every output is
 * summed over k in order, as a plain dot product would. The threads split the panels, so each weight is read
 * from memory once per call.
 *
 * Measured against MKL's sgemm on [in, out] weights (Xeon, AVX-512, the default model's four layer shapes,
 * weights read from memory): the same time at one row (both stream the weights at the memory's rate), 1.7x
 * faster at 8 rows, 1.3x at 64, 1.1x at 128, 1.05x at 256 and 0.93x at 2048 (prefill).
 *
 * int8 weights (one scale per output column) convert to float32 as they are loaded, up to CONVERT_ROWS rows
 * (decode: streaming a quarter of the bytes is what makes int8 fast at a few rows, and an int8 panel stays
 * in the L1 cache for all the tiles of a decode batch); for more rows each panel is converted once into a
 * buffer that stays in the L2 cache and then multiplied like a float32 panel.
 */
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>

#include "entry.h"

#if defined(__AVX512F__)
#define VEC 16       /* floats per vector register */
#define TILE_ROWS 8  /* 8 x 3 sums in 24 of the 32 registers */
#else
#define VEC 8
#define TILE_ROWS 4  /* 4 x 3 sums in 12 of the 16 registers */
#endif
#define PANEL_VECS 3
#define PANEL (PANEL_VECS * VEC) /* output columns per panel */
#define CHUNK_ROWS 256 /* rows of x per pass over the panels: a chunk stays in L2 while the panels stream by */
/* Weights streamed from memory are prefetched this far ahead, into L2 (into L1 was 1.2x slower): 1.5x the
 * rate of one int8 row of x, 1.1x for float32 (measured 0.5 to 32 KiB; the hardware prefetchers alone fall
 * short). */
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

/* rows (at most TILE_ROWS, a constant once inlined) rows of x times one panel into out's PANEL columns;
 * each step of k also prefetches `step` bytes from prefetch + k * step, where prefetch is not null. */
#define DEFINE_TILE(NAME, WEIGHT, LOAD)                                                                    \
    static inline __attribute__((always_inline)) void NAME(                                                \
        const float *x, const WEIGHT *panel, const float *scales, float *out, int64_t n_out, int64_t k_in, \
        const char *prefetch, int step, const int rows) {                                                  \
        vec sums[TILE_ROWS][PANEL_VECS];                                                                   \
        for (int r = 0; r < rows; r++)                                                                     \
            for (int j = 0; j < PANEL_VECS; j++) sums[r][j] = (vec){0};                                    \
        for (int64_t k = 0; k < k_in; k++) {                                                               \
            const WEIGHT *w = panel + k * PANEL;                                                           \
            if (prefetch)                                                                                  \
                for (int line = 0; line < step; line += 64)                                                \
                    __builtin_prefetch(prefetch + k * step + line, 0, 1);                                  \
            vec w0 = LOAD(w), w1 = LOAD(w + VEC), w2 = LOAD(w + 2 * VEC);                                  \
            for (int r = 0; r < rows; r++) {                                                               \
                float a = x[r * k_in + k];                                                                 \
                sums[r][0] += a * w0, sums[r][1] += a * w1, sums[r][2] += a * w2;                          \
            }                                                                                              \
        }                                                                                                  \
        for (int r = 0; r < rows; r++)                                                                     \
            for (int j = 0; j < PANEL_VECS; j++)                                                           \
                *(vec *)(out + r * n_out + j * VEC) = scales ? sums[r][j] * load_f32(scales + j * VEC)     \
                                                             : sums[r][j];                                 \
    }

DEFINE_TILE(tile_f32, float, load_f32)
DEFINE_TILE(tile_i8, int8_t, load_i8)

/* One specialization per row count, so that the sums stay in registers. */
#define FOR_ROWS(TILE, rows, ...)                 \
    switch (rows) {                               \
    case 1: TILE(__VA_ARGS__, 1); break;          \
    case 2: TILE(__VA_ARGS__, 2); break;          \
    case 3: TILE(__VA_ARGS__, 3); break;          \
    case 4: TILE(__VA_ARGS__, 4); break;          \
    IF_WIDE(case 5: TILE(__VA_ARGS__, 5); break;) \
    IF_WIDE(case 6: TILE(__VA_ARGS__, 6); break;) \
    IF_WIDE(case 7: TILE(__VA_ARGS__, 7); break;) \
    default: TILE(__VA_ARGS__, TILE_ROWS); break; \
    }
#if TILE_ROWS == 8
#define IF_WIDE(...) __VA_ARGS__
#else
#define IF_WIDE(...)
#endif

/* Rows [start, end) of x times one panel, whose weights were read from `source` (row_bytes per step of k).
 * The tiles prefetch the panel after it, spread over the first SPREAD tiles so that its fetch overlaps their
 * arithmetic (measured 1.25x at 64 rows); a single tile, which streams its own panel, prefetches
 * PREFETCH_BYTES ahead instead. */
#define DEFINE_PANEL_ROWS(NAME, TILE, WEIGHT)                                                               \
    static void NAME(const float *x, const WEIGHT *panel, const float *scales, float *out, int64_t start,   \
                     int64_t end, int64_t n_out, int64_t k_in, const char *source, int row_bytes) {         \
        int64_t tiles = (end - start + TILE_ROWS - 1) / TILE_ROWS, spread = tiles < SPREAD ? tiles : SPREAD; \
        int step = (row_bytes + spread - 1) / spread;                                                       \
        for (int64_t m = start, t = 0; m < end; m += TILE_ROWS, t++) {                                      \
            int rows = end - m < TILE_ROWS ? end - m : TILE_ROWS;                                           \
            const char *prefetch = tiles == 1 ? source + PREFETCH_BYTES                                     \
                                   : t < spread ? source + (row_bytes + t * step) * k_in : 0;               \
            FOR_ROWS(TILE, rows, x + m * k_in, panel, scales, out + m * n_out, n_out, k_in, prefetch, step) \
        }                                                                                                   \
    }

DEFINE_PANEL_ROWS(panel_rows_f32, tile_f32, float)
DEFINE_PANEL_ROWS(panel_rows_i8, tile_i8, int8_t)

void packed_linear_f32(const float *x, const float *w, float *out, int64_t rows, int64_t n_out, int64_t k_in) {
    int64_t panels = n_out / PANEL, panel_size = PANEL * k_in;
#pragma omp parallel
    for (int64_t start = 0; start < rows; start += CHUNK_ROWS) {
        int64_t end = start + CHUNK_ROWS < rows ? start + CHUNK_ROWS : rows;
#pragma omp for schedule(static)
        for (int64_t p = 0; p < panels; p++)
            panel_rows_f32(x, w + p * panel_size, 0, out + p * PANEL, start, end, n_out, k_in,
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

void packed_linear_i8(const float *x, const int8_t *w, const float *scales, float *out, int64_t rows,
                      int64_t n_out, int64_t k_in) {
    int64_t panels = n_out / PANEL, panel_size = PANEL * k_in;
#pragma omp parallel
    {
        float *converted = rows > CONVERT_ROWS ? thread_buffer(panel_size) : 0;
        for (int64_t start = 0; start < rows; start += CHUNK_ROWS) {
            int64_t end = start + CHUNK_ROWS < rows ? start + CHUNK_ROWS : rows;
#pragma omp for schedule(static)
            for (int64_t p = 0; p < panels; p++) {
                const int8_t *panel = w + p * panel_size;
                if (!converted) {
                    panel_rows_i8(x, panel, scales + p * PANEL, out + p * PANEL, start, end, n_out, k_in,
                                  (const char *)panel, PANEL);
                    continue;
                }
                for (int64_t i = 0; i < panel_size; i += VEC) *(vec *)(converted + i) = load_i8(panel + i);
                panel_rows_f32(x, converted, scales + p * PANEL, out + p * PANEL, start, end, n_out, k_in,
                               (const char *)panel, PANEL);
            }
        }
    }
}

void packed_linear_f32_entry(const int64_t *args) {
    packed_linear_f32(ARG(0, const float *), ARG(1, const float *), ARG(2, float *), args[3], args[4], args[5]);
}

void packed_linear_i8_entry(const int64_t *args) {
    packed_linear_i8(ARG(0, const float *), ARG(1, const int8_t *), ARG(2, const float *), ARG(3, float *), args[4],
                     args[5], args[6]);
}
