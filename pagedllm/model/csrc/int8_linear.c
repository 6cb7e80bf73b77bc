/* Weight-only int8 linear layer, float32 activations on CPU: out[m][n] = scales[n] * (x[m] . w[n]).
 *
 * At decode a linear layer reads each weight once per step, so its time is the time to stream the weights
 * from memory, and int8 weights (one scale per output row) stream four times faster than float32. Rows of
 * w are split among the threads, four at a time: four independent sums keep the FMA units busy, where one
 * sum would wait on each addition. The rows a few iterations ahead are prefetched (measured: 8.3 ms instead
 * of 12 for a decode step's weights of the default model). With more than one row of x, the four rows of w
 * are converted to float32 once, into a buffer that stays in L1, instead of once per row of x. For many
 * rows of x (prefill) the caller instead dequantizes the weights and runs a float32 matmul, whose blocking
 * reuses each loaded weight better.
 */
#include <stdint.h>

#define OUT_ROWS 4        /* rows of w per iteration; n_out must be a multiple of it */
#define PREFETCH_ROWS 16  /* how far ahead: measured best of 8 to 64 */

static inline void dot4(const float *x, const int8_t *w, int64_t k_in, float *sums) {
    const int8_t *w0 = w, *w1 = w + k_in, *w2 = w + 2 * k_in, *w3 = w + 3 * k_in;
    float d0 = 0.0f, d1 = 0.0f, d2 = 0.0f, d3 = 0.0f;
    for (int64_t k = 0; k < k_in; k++) {
        d0 += x[k] * (float)w0[k];
        d1 += x[k] * (float)w1[k];
        d2 += x[k] * (float)w2[k];
        d3 += x[k] * (float)w3[k];
    }
    sums[0] = d0, sums[1] = d1, sums[2] = d2, sums[3] = d3;
}

/* Two rows of x against four converted rows of w: eight sums, each weight loaded once for both rows. */
static inline void dot2x4(const float *x0, const float *x1, const float *w, int64_t k_in, float *sums0,
                          float *sums1) {
    const float *w0 = w, *w1 = w + k_in, *w2 = w + 2 * k_in, *w3 = w + 3 * k_in;
    float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f, b0 = 0.0f, b1 = 0.0f, b2 = 0.0f, b3 = 0.0f;
    for (int64_t k = 0; k < k_in; k++) {
        a0 += x0[k] * w0[k];
        a1 += x0[k] * w1[k];
        a2 += x0[k] * w2[k];
        a3 += x0[k] * w3[k];
        b0 += x1[k] * w0[k];
        b1 += x1[k] * w1[k];
        b2 += x1[k] * w2[k];
        b3 += x1[k] * w3[k];
    }
    sums0[0] = a0, sums0[1] = a1, sums0[2] = a2, sums0[3] = a3;
    sums1[0] = b0, sums1[1] = b1, sums1[2] = b2, sums1[3] = b3;
}

void int8_linear(const float *x, const int8_t *w, const float *scales, float *out, int64_t rows, int64_t n_out,
                 int64_t k_in) {
#pragma omp parallel
    {
        float converted[OUT_ROWS * k_in];
#pragma omp for schedule(static)
        for (int64_t n = 0; n < n_out; n += OUT_ROWS) {
            const int8_t *block = w + n * k_in;
            if (n + PREFETCH_ROWS < n_out)
                for (int64_t line = 0; line < OUT_ROWS * k_in; line += 64)
                    __builtin_prefetch(w + (n + PREFETCH_ROWS) * k_in + line);
            if (rows > 1)
                for (int64_t i = 0; i < OUT_ROWS * k_in; i++) converted[i] = (float)block[i];
            float sums[2][OUT_ROWS];
            if (rows == 1) {
                dot4(x, block, k_in, sums[0]);
                for (int r = 0; r < OUT_ROWS; r++) out[n + r] = sums[0][r] * scales[n + r];
                continue;
            }
            for (int64_t m = 0; m < rows; m += 2) {
                const int pair = m + 1 < rows;  /* an odd last row pairs with itself */
                dot2x4(x + m * k_in, x + (m + pair) * k_in, converted, k_in, sums[0], sums[1]);
                for (int i = 0; i <= pair; i++)
                    for (int r = 0; r < OUT_ROWS; r++) out[(m + i) * n_out + n + r] = sums[i][r] * scales[n + r];
            }
        }
    }
}
