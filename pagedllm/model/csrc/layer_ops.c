/* The element-wise steps of a decoder layer, float32 on CPU, each one pass over its rows.
 *
 * In PyTorch each of these is several operators (RMSNorm after the residual add, the rotary embedding and
 * the cache write, SiLU times up), and at decode, with few rows, dispatching them costs more than their
 * arithmetic. Rows run in parallel once there are enough of them to pay for waking the threads, handed out
 * in shrinking chunks (guided): a thread that other work on the machine holds up leaves its rows to the
 * others instead of holding up the call. A row's result does not depend on the thread that computes it.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "entry.h"
#include "fast_exp.h"

/* Rows from which the threads share the work: measured on a 64-row decode step, two threads halve SiLU and
 * split the page faults of first writes to fresh cache blocks (rope_and_cache 300 -> 180 us). */
#define PARALLEL_ROWS 16

/* residual += x (where residual is given), then out = norm(residual or x) * weight; rows of `hidden`. */
void add_rms_norm(const float *x, float *residual, const float *weight, float *out, int64_t rows, int64_t hidden,
                  float eps) {
#pragma omp parallel for if (rows >= PARALLEL_ROWS) schedule(guided)
    for (int64_t r = 0; r < rows; r++) {
        const float *src = x + r * hidden;
        if (residual) {
            float *sum = residual + r * hidden;
            for (int64_t i = 0; i < hidden; i++) sum[i] += src[i];
            src = sum;
        }
        float squares = 0.0f;
        for (int64_t i = 0; i < hidden; i++) squares += src[i] * src[i];
        const float inverse = 1.0f / sqrtf(squares / (float)hidden + eps);
        float *dst = out + r * hidden;
        for (int64_t i = 0; i < hidden; i++) dst[i] = weight[i] * (src[i] * inverse);
    }
}

/* Rotates the query and key heads of qkv [tokens, heads + 2 * kv_heads, head_dim] in place (half-split
 * layout; sin's first half stored negated, as the rotary tables keep it), then copies each token's keys and
 * values into its cache slot. cos_table, sin_table: [max_position, head_dim], the rows of each token's position
 * used; caches: [kv_heads, cache_slots, head_dim]. */
void rope_and_cache(float *qkv, const float *restrict cos_table, const float *restrict sin_table,
                    const int64_t *positions, const int64_t *slots, float *restrict k_cache, float *restrict v_cache,
                    int64_t tokens, int64_t heads, int64_t kv_heads, int64_t cache_slots, int64_t head_dim) {
    const int64_t stride = (heads + 2 * kv_heads) * head_dim, half = head_dim / 2;
#pragma omp parallel for if (tokens >= PARALLEL_ROWS) schedule(guided)
    for (int64_t t = 0; t < tokens; t++) {
        float *row = qkv + t * stride;
        const float *c = cos_table + positions[t] * head_dim, *s = sin_table + positions[t] * head_dim;
        for (int64_t h = 0; h < heads + kv_heads; h++) {
            float *restrict x = row + h * head_dim;
            for (int64_t i = 0; i < half; i++) {
                const float first = x[i], second = x[i + half];
                x[i] = first * c[i] + second * s[i];
                x[i + half] = second * c[i + half] + first * s[i + half];
            }
        }
        for (int64_t h = 0; h < kv_heads; h++) {
            const float *k = row + (heads + h) * head_dim, *v = row + (heads + kv_heads + h) * head_dim;
            memcpy(k_cache + (h * cache_slots + slots[t]) * head_dim, k, head_dim * sizeof(float));
            memcpy(v_cache + (h * cache_slots + slots[t]) * head_dim, v, head_dim * sizeof(float));
        }
    }
}

/* out [rows, size] = silu(gate) * up, where gate_up [rows, 2 * size] holds gate then up. */
void silu_and_mul(const float *gate_up, float *out, int64_t rows, int64_t size) {
#pragma omp parallel for if (rows >= PARALLEL_ROWS) schedule(guided)
    for (int64_t r = 0; r < rows; r++) {
        const float *gate = gate_up + r * 2 * size, *up = gate + size;
        float *dst = out + r * size;
        for (int64_t i = 0; i < size; i++) dst[i] = gate[i] / (1.0f + fast_exp(-gate[i])) * up[i];
    }
}

void add_rms_norm_entry(const int64_t *args) {
    add_rms_norm(ARG(0, const float *), ARG(1, float *), ARG(2, const float *), ARG(3, float *), args[4], args[5],
                 float_arg(args, 6));
}

void rope_and_cache_entry(const int64_t *args) {
    rope_and_cache(ARG(0, float *), ARG(1, const float *), ARG(2, const float *), ARG(3, const int64_t *),
                   ARG(4, const int64_t *), ARG(5, float *), ARG(6, float *), args[7], args[8], args[9], args[10],
                   args[11]);
}

void silu_and_mul_entry(const int64_t *args) {
    silu_and_mul(ARG(0, const float *), ARG(1, float *), args[2], args[3]);
}
