/* Attention of query tokens over a paged KV cache, float32 on CPU, each token on its own.
 *
 * Row r is one query token (all its heads); it attends to the first row_lens[r] tokens of its sequence,
 * found through block_tables[row_tables[r]] (block_tables[r] where row_tables is null: one decode token per
 * sequence). The cache is read in place, block by block, in segments of SEGMENT tokens from position 0 (the
 * scores of a segment, their softmax, then its values, an online softmax across segments): no gathered copy
 * of the context is made. Every row is reduced in the same order, over the same blocks, whichever rows share
 * the call: a prefill token, a chunk's token and a decode token at the same position compute the same result
 * (batch invariance). The query heads sharing a KV head are handled together, so each key and value is
 * loaded once for all of them.
 *
 * At decode the kernel streams the cache from memory, and on one core of an AMD Zen 3 its arithmetic did not
 * overlap those reads (the time was their sum), so the arithmetic is kept lean: dot products run on tiles of
 * four tokens by the group's heads, their sums held in vector registers and reduced across lanes four tokens
 * at a time; one softmax per segment (a whole decode context of the default workload) instead of one per
 * block; the weighted sum of values keeps a slice of each head's output in registers over a whole block.
 * Blocks lie apart in memory, where the hardware prefetcher does not follow: each block read prefetches into
 * L2 the one two reads later, in the next row where the row ends (the threads take rows in runs).
 * Measured on one core of an AMD Zen 3, 64 sequences of 192 tokens over 30 layers' caches: 1.15-1.3x the
 * kernel it replaced (one softmax per block, dot products reduced token by token); fewer lines, or into L1,
 * measured the same or slower; 2 MB pages for the cache, 5% (noise). On both cores of an AMD Zen 4, two
 * blocks ahead instead of one: 1.06x at 32 and 64 sequences, 1.02x at 16. There, reading the same blocks in
 * the same order with the arithmetic replaced by a plain sum reached 27-28 GB/s against 33-36 for a
 * sequential read of as many bytes, and this kernel 25-26: scattered 4 KiB blocks, not the arithmetic, bound
 * it.
 *
 * Layouts: q [rows, kv_heads * GROUP, HEAD_DIM] with q_stride floats between rows (a view of the merged QKV
 * projection), out [rows, kv_heads * GROUP, HEAD_DIM]; k_cache, v_cache [kv_heads, num_blocks,
 * BLOCK_SIZE, HEAD_DIM]; block_tables [sequences, max_blocks]; row_tables, row_lens [rows].
 *
 * The model's shape is fixed at compile time (-DGROUP, -DHEAD_DIM, -DBLOCK_SIZE) so that every inner
 * loop has a constant trip count the compiler unrolls and vectorizes, exp included.
 */
#include <float.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>

#include "entry.h"
#include "fast_exp.h"

#if defined(__AVX__)
#include <immintrin.h>
#endif

#if !defined(GROUP) || !defined(HEAD_DIM) || !defined(BLOCK_SIZE)
#error "compile with -DGROUP=<query heads per KV head> -DHEAD_DIM=<d> -DBLOCK_SIZE=<tokens per block>"
#endif

/* Floats per vector, and how many vector registers the sums of a tile may take (of 32 with AVX-512, of 16
 * otherwise, leaving room for the operands). */
#if defined(__AVX512F__) && HEAD_DIM % 16 == 0
#define VEC 16
#define SUM_REGS 24
#elif defined(__AVX__) && HEAD_DIM % 8 == 0
#define VEC 8
#define SUM_REGS 12
#elif HEAD_DIM % 4 == 0
#define VEC 4
#define SUM_REGS 12
#else
#define VEC 1
#define SUM_REGS 12
#endif
#define CHUNKS (HEAD_DIM / VEC)
#define LINE_FLOATS 16                         /* floats per 64-byte cache line */
#define BLOCK_LINES (BLOCK_SIZE * HEAD_DIM / LINE_FLOATS)
/* Tokens whose scores are computed before their softmax and values: a whole short context at once. */
#define SEGMENT_BLOCKS (BLOCK_SIZE >= 256 ? 1 : 256 / BLOCK_SIZE)
#define SEGMENT (SEGMENT_BLOCKS * BLOCK_SIZE)
#define TILES_PER_BLOCK (BLOCK_SIZE < 4 ? 1 : BLOCK_SIZE / 4) /* tiles of four tokens */
/* Lines of the next block's keys (and as many of its values) each tile prefetches. */
#define PREFETCH_LINES ((BLOCK_LINES + TILES_PER_BLOCK - 1) / TILES_PER_BLOCK)

typedef float vec __attribute__((vector_size(VEC * 4), aligned(4)));

static inline __attribute__((always_inline)) vec load(const float *p) { return *(const vec *)p; }

/* Holds v in a register at this point. GCC folds a vector's load into every multiply-add that reads it, so a key
 * or value that serves the GROUP heads was loaded GROUP times (the value loop on AVX2: 15 loads to 12
 * multiply-adds; loaded once into a register, 7); and under -ffast-math it regrouped each score's sum over the
 * chunks into products and adds, reloading operands from the stack. Holding the loaded keys, values and queries
 * and the running sums in registers keeps each sum one chain of multiply-adds, in chunk order: 1.03-1.05x at 16 to 64
 * sequences in two runs and 1.1x for 12 rows of one sequence, on an AMD Zen 3 (attention_kernel.py against the kernel
 * before). */
#if (defined(__x86_64__) || defined(__i386__)) && VEC > 1 /* a single float is no vector register */
#define IN_REGISTER(v) __asm__("" : "+v"(v))
#else
#define IN_REGISTER(v) ((void)0)
#endif

/* The largest divisor of n that is at most limit (at least 1): a loop split into equal parts. */
static inline __attribute__((always_inline)) int divisor_up_to(int n, int limit) {
    int d = limit < n ? limit : n;
    while (d > 1 && n % d) d--;
    return d > 0 ? d : 1;
}

/* A token's dot product is summed lane by lane over the chunks, then across the lanes; with AVX the lanes of
 * two tokens are added pairwise (pair_sums) as soon as their chunks are done, which frees their registers
 * for the next pair, and two pairs make four sums. The order is fixed whatever the batch. */
static inline __attribute__((always_inline)) float lane_sum(vec v) {
    float total = 0.0f;
    for (int lane = 0; lane < VEC; lane++) total += v[lane];
    return total;
}

#if defined(__AVX__) && (VEC == 8 || VEC == 16)
typedef __m256 pair_sums;

static inline __attribute__((always_inline)) __m256 fold_to_256(vec v) {
#if VEC == 16
    const __m512 wide = (__m512)v;
    return _mm256_add_ps(_mm512_castps512_ps256(wide), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(wide), 1)));
#else
    return (__m256)v;
#endif
}

static inline __attribute__((always_inline)) pair_sums sum_pair(vec a, vec b) {
    return _mm256_hadd_ps(fold_to_256(a), fold_to_256(b));
}

/* out[0..3] = the dot products of the two pairs' tokens. */
static inline __attribute__((always_inline)) void finish_sums(pair_sums first, pair_sums second, float *out) {
    const __m256 quads = _mm256_hadd_ps(first, second);
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(quads), _mm256_extractf128_ps(quads, 1)));
}
#else
typedef struct { float first, second; } pair_sums;

static inline __attribute__((always_inline)) pair_sums sum_pair(vec a, vec b) {
    return (pair_sums){lane_sum(a), lane_sum(b)};
}

static inline __attribute__((always_inline)) void finish_sums(pair_sums first, pair_sums second, float *out) {
    out[0] = first.first, out[1] = first.second, out[2] = second.first, out[3] = second.second;
}
#endif

/* sums[g][t] = query[g] . keys[t], for t < 2, lane by lane. */
static inline __attribute__((always_inline)) void pair_dots(const vec query[GROUP][CHUNKS], const float *keys,
                                                            int g0, int heads, vec sums[GROUP][2]) {
    for (int g = 0; g < heads; g++) sums[g][0] = sums[g][1] = (vec){0};
    for (int c = 0; c < CHUNKS; c++) {
        vec first = load(keys + c * VEC), second = load(keys + HEAD_DIM + c * VEC);
        IN_REGISTER(first);
        IN_REGISTER(second);
        for (int g = 0; g < heads; g++) {
            vec q = query[g0 + g][c];
            IN_REGISTER(q);
            sums[g][0] += q * first;
            sums[g][1] += q * second;
            IN_REGISTER(sums[g][0]);
            IN_REGISTER(sums[g][1]);
        }
    }
}

/* Lines [first, first + count) of a block, into L2 (null: none). */
static inline __attribute__((always_inline)) void prefetch_lines(const float *block, int first, int count) {
    if (!block) return;
    for (int line = first; line < first + count && line < BLOCK_LINES; line++)
        __builtin_prefetch(block + line * LINE_FLOATS, 0, 1);
}

/* scores[g][offset + t] = query[g] . keys[t] for the tiles of four tokens below `visible` (a block of fewer
 * than four tokens: each token alone), while prefetching the block `ahead` a share per tile. */
static inline __attribute__((always_inline)) void block_scores(const vec query[GROUP][CHUNKS], const float *keys,
                                                               int64_t visible, const float *ahead,
                                                               float scores[GROUP][SEGMENT], int64_t offset) {
    if (BLOCK_SIZE < 4) {
        prefetch_lines(ahead, 0, BLOCK_LINES);
        for (int t = 0; t < visible; t++)
            for (int g = 0; g < GROUP; g++) {
                vec sum = {0};
                for (int c = 0; c < CHUNKS; c++) sum += query[g][c] * load(keys + t * HEAD_DIM + c * VEC);
                scores[g][offset + t] = lane_sum(sum);
            }
        return;
    }
    const int heads = divisor_up_to(GROUP, SUM_REGS / 2); /* heads per pass over a pair of keys */
    for (int t0 = 0; t0 < visible; t0 += 4) {
        prefetch_lines(ahead, t0 / 4 * PREFETCH_LINES, PREFETCH_LINES);
        for (int g0 = 0; g0 < GROUP; g0 += heads) {
            vec sums[GROUP][2];
            pair_sums firsts[GROUP];
            pair_dots(query, keys + t0 * HEAD_DIM, g0, heads, sums);
            for (int g = 0; g < heads; g++) firsts[g] = sum_pair(sums[g][0], sums[g][1]);
            pair_dots(query, keys + (t0 + 2) * HEAD_DIM, g0, heads, sums);
            for (int g = 0; g < heads; g++)
                finish_sums(firsts[g], sum_pair(sums[g][0], sums[g][1]), &scores[g0 + g][offset + t0]);
        }
    }
}

/* acc[g] += the sum over the first `visible` tokens of weights[g][offset + t] * values[t], in token order, while
 * prefetching the block `ahead`; a slice of chunks of every head stays in registers over the whole block. */
static inline __attribute__((always_inline)) void accumulate_values(vec acc[GROUP][CHUNKS], const float *values,
                                                                    const float weights[GROUP][SEGMENT],
                                                                    int64_t offset, int64_t visible,
                                                                    const float *ahead) {
    prefetch_lines(ahead, 0, BLOCK_LINES);
    const int slice = divisor_up_to(CHUNKS, SUM_REGS / GROUP);
    for (int c0 = 0; c0 < CHUNKS; c0 += slice) {
        vec sums[GROUP][CHUNKS];
        for (int g = 0; g < GROUP; g++)
            for (int c = 0; c < slice; c++) sums[g][c] = acc[g][c0 + c];
        for (int64_t t = 0; t < visible; t++)
            for (int c = 0; c < slice; c++) {
                vec value = load(values + t * HEAD_DIM + (c0 + c) * VEC);
                IN_REGISTER(value);
                for (int g = 0; g < GROUP; g++) sums[g][c] += weights[g][offset + t] * value;
            }
        for (int g = 0; g < GROUP; g++)
            for (int c = 0; c < slice; c++) acc[g][c0 + c] = sums[g][c];
    }
}

/* What one row reads for one KV head: that head's key and value blocks, the sequence's block table, and how
 * many tokens it attends to. */
typedef struct {
    const float *keys, *values;
    const int64_t *table;
    int64_t length;
} row_source;

static inline const float *block_at(const float *plane, const int64_t *table, int64_t block) {
    return plane + table[block] * BLOCK_SIZE * HEAD_DIM;
}

/* Scale acc and the softmax state for a new segment of scores [GROUP][length]: turns the scores into their
 * weights under the running maximum, in place. */
static inline __attribute__((always_inline)) void segment_softmax(float scores[GROUP][SEGMENT], int64_t length,
                                                                  float running_max[GROUP], float denominator[GROUP],
                                                                  vec acc[GROUP][CHUNKS]) {
    for (int g = 0; g < GROUP; g++) {
        float segment_max = -FLT_MAX;
        for (int64_t t = 0; t < length; t++) segment_max = scores[g][t] > segment_max ? scores[g][t] : segment_max;
        const float new_max = segment_max > running_max[g] ? segment_max : running_max[g];
        const float correction = fast_exp(running_max[g] - new_max);
        float sum = 0.0f;
        for (int64_t t = 0; t < length; t++) {
            scores[g][t] = fast_exp(scores[g][t] - new_max);
            sum += scores[g][t];
        }
        denominator[g] = denominator[g] * correction + sum;
        running_max[g] = new_max;
        for (int c = 0; c < CHUNKS; c++) acc[g][c] *= correction;
    }
}

/* Blocks ahead of the one being read that each read prefetches: far enough that the scattered blocks arrive
 * before they are needed, near enough that they are still in L2 when they are. */
#ifndef PREFETCH_BLOCKS
#define PREFETCH_BLOCKS 2
#endif

/* The n-th block a row reads, segment by segment its keys then its values (n below twice its blocks). */
static inline const float *nth_read(row_source row, int64_t n) {
    const int64_t blocks = (row.length + BLOCK_SIZE - 1) / BLOCK_SIZE, segment = n / (2 * SEGMENT_BLOCKS);
    const int64_t first = segment * SEGMENT_BLOCKS, index = n - 2 * first;
    const int64_t in_segment = blocks - first < SEGMENT_BLOCKS ? blocks - first : SEGMENT_BLOCKS;
    return index < in_segment ? block_at(row.keys, row.table, first + index)
                              : block_at(row.values, row.table, first + index - in_segment);
}

/* The n-th block read from the start of rows[0], going on into the rows after it (null past the last). */
static const float *read_from(const row_source *rows, int64_t count, int64_t n) {
    for (int64_t r = 0; r < count; r++) {
        const int64_t reads = 2 * ((rows[r].length + BLOCK_SIZE - 1) / BLOCK_SIZE);
        if (n < reads) return nth_read(rows[r], n);
        n -= reads;
    }
    return 0;
}

/* The attention of rows[0] for the GROUP query heads of one KV head (q and out point at the group's first
 * head), segment by segment: the segment's scores, their softmax, then its values. Each block read
 * prefetches the one PREFETCH_BLOCKS reads later, in this row or in the `count` - 1 rows the thread takes
 * after it. */
static void attend(const float *q, const row_source *rows, int64_t count, float scale, float *out) {
    const row_source row = rows[0];
    vec query[GROUP][CHUNKS], acc[GROUP][CHUNKS];
    float running_max[GROUP], denominator[GROUP];
    for (int g = 0; g < GROUP; g++) {
        for (int c = 0; c < CHUNKS; c++) {
            query[g][c] = load(q + g * HEAD_DIM + c * VEC) * scale;
            acc[g][c] = (vec){0};
        }
        running_max[g] = -FLT_MAX;
        denominator[g] = 0.0f;
    }
    int64_t read = PREFETCH_BLOCKS; /* the read to prefetch next */
    for (int64_t start = 0; start < row.length; start += SEGMENT) {
        const int64_t length = row.length - start < SEGMENT ? row.length - start : SEGMENT;
        const int64_t first = start / BLOCK_SIZE, blocks = (length + BLOCK_SIZE - 1) / BLOCK_SIZE;
        float scores[GROUP][SEGMENT];
        for (int64_t b = 0; b < blocks; b++) {
            const int64_t visible = length - b * BLOCK_SIZE < BLOCK_SIZE ? length - b * BLOCK_SIZE : BLOCK_SIZE;
            block_scores(query, block_at(row.keys, row.table, first + b), visible, read_from(rows, count, read++),
                         scores, b * BLOCK_SIZE);
        }
        segment_softmax(scores, length, running_max, denominator, acc);
        for (int64_t b = 0; b < blocks; b++) {
            const int64_t visible = length - b * BLOCK_SIZE < BLOCK_SIZE ? length - b * BLOCK_SIZE : BLOCK_SIZE;
            accumulate_values(acc, block_at(row.values, row.table, first + b), scores, b * BLOCK_SIZE, visible,
                              read_from(rows, count, read++));
        }
    }
    for (int g = 0; g < GROUP; g++)
        for (int c = 0; c < CHUNKS; c++) *(vec *)(out + g * HEAD_DIM + c * VEC) = acc[g][c] / denominator[g];
}

/* Rows per unit of work a thread takes: a thread's rows follow each other, so each prefetches the next; but
 * at least TASKS_PER_THREAD units per thread, so that a thread slowed by other work on its core leaves the rest
 * of its share to the others. */
#define MAX_ROWS_PER_TASK 8
#define TASKS_PER_THREAD 16

void paged_attention_rows(const float *q, const float *k_cache, const float *v_cache, float *out,
                          const int64_t *block_tables, const int64_t *row_tables, const int64_t *row_lens,
                          int64_t rows, int64_t q_stride, int64_t kv_heads, int64_t num_blocks, int64_t max_blocks,
                          float scale) {
    const int64_t heads = kv_heads * GROUP, head_blocks = num_blocks * BLOCK_SIZE * HEAD_DIM, items = kv_heads * rows;
    int64_t per_task = items / (TASKS_PER_THREAD * omp_get_max_threads());
    per_task = per_task < 1 ? 1 : per_task > MAX_ROWS_PER_TASK ? MAX_ROWS_PER_TASK : per_task;
    const int64_t tasks = (items + per_task - 1) / per_task;
    /* Items run KV head outermost: the threads take neighbouring rows of one head, which for a prefill's
     * tokens read the same keys, while they are in the caches they share. */
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; task++) {
        const int64_t first = task * per_task, end = first + per_task < items ? first + per_task : items;
        row_source sources[MAX_ROWS_PER_TASK];
        for (int64_t item = first; item < end; item++) {
            const int64_t h = item / rows, r = item % rows;
            sources[item - first] = (row_source){k_cache + h * head_blocks, v_cache + h * head_blocks,
                                                 block_tables + (row_tables ? row_tables[r] : r) * max_blocks,
                                                 row_lens[r]};
        }
        for (int64_t item = first; item < end; item++) {
            const int64_t h = item / rows, r = item % rows, i = item - first;
            attend(q + r * q_stride + h * GROUP * HEAD_DIM, sources + i, end - item, scale,
                   out + (r * heads + h * GROUP) * HEAD_DIM);
        }
    }
}

void paged_attention_rows_entry(const int64_t *args) {
    paged_attention_rows(ARG(0, const float *), ARG(1, const float *), ARG(2, const float *), ARG(3, float *),
                         ARG(4, const int64_t *), ARG(5, const int64_t *), ARG(6, const int64_t *), args[7],
                         args[8], args[9], args[10], args[11], float_arg(args, 12));
}
