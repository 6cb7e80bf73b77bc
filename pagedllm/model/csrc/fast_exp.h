/* e^x in float32 within 2 ulp of expf, written out so that compilers vectorize it (libm's expf is a scalar
 * call): e^x = 2^n e^r with |r| <= ln2/2, e^r from a degree-6 polynomial (the Cephes coefficients). */
#ifndef PAGEDLLM_FAST_EXP_H
#define PAGEDLLM_FAST_EXP_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline float fast_exp(float x) {
    x = x > -87.0f ? x : -87.0f;  /* 2^n stays a normal float at both ends */
    x = x < 88.0f ? x : 88.0f;
    const float n = floorf(x * 1.44269504088896341f + 0.5f);
    const float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    const int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

#endif
