/* Attention of query tokens over a paged KV cache, float32 on CPU, each token on its own.
 *
 * Row r is one query token (all its heads); it attends to the first row_lens[r] tokens of its sequence,
 * found through block_tables[row_tables[r]] (block_tables[r] where row_tables is null: one decode token per
 * sequence). The cache is read in place, block by block, with an online softmax: no gathered copy of the
 * context is made. Every row is reduced in the same order, over the same blocks, whichever rows share the
 * call: a prefill token, a chunk's token and a decode token at the same position compute the same result
 * (batch invariance). The query heads sharing a
 * KV head are handled together, so each key and value is loaded once for all of them. Blocks lie apart in
 * memory, where the hardware prefetcher does not follow: each block's successor is prefetched by hand.
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
#include <stdint.h>

#include "entry.h"
#include "fast_exp.h"

#if !defined(GROUP) || !defined(HEAD_DIM) || !defined(BLOCK_SIZE)
#error "compile with -DGROUP=<query heads per KV head> -DHEAD_DIM=<d> -DBLOCK_SIZE=<tokens per block>"
#endif

void paged_attention_rows(const float *q, const float *k_cache, const float *v_cache, float *out,
                          const int64_t *block_tables, const int64_t *row_tables, const int64_t *row_lens,
                          int64_t rows, int64_t q_stride, int64_t kv_heads, int64_t num_blocks, int64_t max_blocks,
                          float scale) {
    const int64_t heads = kv_heads * GROUP;
    /* KV head outermost: the threads take neighbouring rows of one head, which for a prefill's tokens read
     * the same keys, while they are in the caches they share. */
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
    for (int64_t h = 0; h < kv_heads; h++) {
        for (int64_t r = 0; r < rows; r++) {
            float query[GROUP][HEAD_DIM], acc[GROUP][HEAD_DIM], weights[GROUP][BLOCK_SIZE];
            float running_max[GROUP], denominator[GROUP];
            for (int g = 0; g < GROUP; g++) {
                const float *src = q + r * q_stride + (h * GROUP + g) * HEAD_DIM;
                for (int i = 0; i < HEAD_DIM; i++) {
                    query[g][i] = src[i] * scale;
                    acc[g][i] = 0.0f;
                }
                running_max[g] = -FLT_MAX;
                denominator[g] = 0.0f;
            }
            const int64_t *table = block_tables + (row_tables ? row_tables[r] : r) * max_blocks;
            const int64_t length = row_lens[r];
            for (int64_t start = 0; start < length; start += BLOCK_SIZE) {
                const int64_t visible = length - start < BLOCK_SIZE ? length - start : BLOCK_SIZE;
                const int64_t offset = (h * num_blocks + table[start / BLOCK_SIZE]) * BLOCK_SIZE * HEAD_DIM;
                const float *keys = k_cache + offset, *values = v_cache + offset;
                if (start + BLOCK_SIZE < length) {
                    const int64_t next = (h * num_blocks + table[start / BLOCK_SIZE + 1]) * BLOCK_SIZE * HEAD_DIM;
                    for (int line = 0; line < BLOCK_SIZE * HEAD_DIM; line += 16) {
                        __builtin_prefetch(k_cache + next + line);
                        __builtin_prefetch(v_cache + next + line);
                    }
                }
                float scores[GROUP][BLOCK_SIZE];
                for (int t = 0; t < BLOCK_SIZE; t++) {
                    float dot[GROUP] = {0};
                    for (int g = 0; g < GROUP; g++)
                        for (int i = 0; i < HEAD_DIM; i++) dot[g] += query[g][i] * keys[t * HEAD_DIM + i];
                    for (int g = 0; g < GROUP; g++) scores[g][t] = t < visible ? dot[g] : -FLT_MAX;
                }
                for (int g = 0; g < GROUP; g++) {
                    float block_max = -FLT_MAX;
                    for (int t = 0; t < BLOCK_SIZE; t++) block_max = scores[g][t] > block_max ? scores[g][t] : block_max;
                    const float new_max = block_max > running_max[g] ? block_max : running_max[g];
                    const float correction = fast_exp(running_max[g] - new_max);
                    float block_sum = 0.0f;
                    for (int t = 0; t < BLOCK_SIZE; t++) {
                        weights[g][t] = t < visible ? fast_exp(scores[g][t] - new_max) : 0.0f;
                        block_sum += weights[g][t];
                    }
                    denominator[g] = denominator[g] * correction + block_sum;
                    running_max[g] = new_max;
                    for (int i = 0; i < HEAD_DIM; i++) acc[g][i] *= correction;
                }
                for (int t = 0; t < visible; t++)
                    for (int g = 0; g < GROUP; g++)
                        for (int i = 0; i < HEAD_DIM; i++) acc[g][i] += weights[g][t] * values[t * HEAD_DIM + i];
            }
            for (int g = 0; g < GROUP; g++) {
                float *dst = out + (r * heads + h * GROUP + g) * HEAD_DIM;
                for (int i = 0; i < HEAD_DIM; i++) dst[i] = acc[g][i] / denominator[g];
            }
        }
    }
}

void paged_attention_rows_entry(const int64_t *args) {
    paged_attention_rows(ARG(0, const float *), ARG(1, const float *), ARG(2, const float *), ARG(3, float *),
                         ARG(4, const int64_t *), ARG(5, const int64_t *), ARG(6, const int64_t *), args[7],
                         args[8], args[9], args[10], args[11], float_arg(args, 12));
}
