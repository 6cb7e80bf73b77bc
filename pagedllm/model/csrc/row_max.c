/* Each row's largest value and the index of its first occurrence, float32 on CPU: the argmax that greedy
 * sampling, verification and a draft model take of every logits row.
 *
 * PyTorch's max over a dimension compares one element at a time (about 100 us for a 49152-token row on an
 * AMD Zen 3); here one vectorized pass finds the maximum and a second finds where it first occurs, as
 * PyTorch does on ties. A row holding NaN gives NaN at its first NaN, as PyTorch's max does; NaN is found
 * by the bits of each value, which -ffast-math leaves alone.
 */
#include <stdint.h>
#include <string.h>

#include "entry.h"

/* Rows from which the threads share the work (a row of the default model's vocabulary takes microseconds). */
#define PARALLEL_ROWS 16
/* Elements per block of a row's one vectorized pass; the first occurrence is then looked for in one block. */
#define BLOCK 512

static inline int is_nan(uint32_t bits) { return (bits & 0x7fffffffu) > 0x7f800000u; }

/* The index of x's maximum (its first occurrence), or of its first NaN where it has one. */
static int64_t first_max(const float *x, int64_t size) {
    float best = x[0];
    int64_t best_block = 0;
    uint32_t nan = 0;
    for (int64_t start = 0; start < size; start += BLOCK) {
        const int64_t end = start + BLOCK < size ? start + BLOCK : size;
        const uint32_t *bits = (const uint32_t *)x;
        float block_max = x[start];
        for (int64_t i = start; i < end; i++) {
            block_max = x[i] > block_max ? x[i] : block_max;
            nan |= is_nan(bits[i]);
        }
        if (block_max > best) {
            best = block_max;
            best_block = start;
        }
    }
    int64_t i = 0;
    if (nan) {
        while (!is_nan(((const uint32_t *)x)[i])) i++;
        return i;
    }
    for (i = best_block; x[i] != best; i++) {
    }
    return i;
}

/* values [rows], indices [rows] of x [rows, size] (rows `stride` floats apart). */
void row_max(const float *x, float *values, int64_t *indices, int64_t rows, int64_t size, int64_t stride) {
#pragma omp parallel for if (rows >= PARALLEL_ROWS) schedule(guided)
    for (int64_t r = 0; r < rows; r++) {
        const float *row = x + r * stride;
        const int64_t index = first_max(row, size);
        values[r] = row[index];
        indices[r] = index;
    }
}

void row_max_entry(const int64_t *args) {
    row_max(ARG(0, const float *), ARG(1, float *), ARG(2, int64_t *), args[3], args[4], args[5]);
}
