/* Each kernel file exports, besides its kernels, one entry point per kernel that takes the kernel's
 * arguments as a single array of 64-bit words: pointers and integers as themselves, floats as their bit
 * pattern in the low 32 bits. Python calls every kernel this one way (cpu_kernels.Kernel), and a recorded
 * sequence of calls can be replayed from C without Python (plan.c). */
#ifndef PAGEDLLM_ENTRY_H
#define PAGEDLLM_ENTRY_H

#include <stdint.h>
#include <string.h>

/* Argument i of an entry's array as `type` (a pointer or an integer). */
#define ARG(i, type) ((type)(intptr_t)args[i])

/* Argument i of an entry's array as the float whose bits it holds. */
static inline float float_arg(const int64_t *args, int i) {
    const int32_t bits = (int32_t)args[i];
    float value;
    memcpy(&value, &bits, sizeof value);
    return value;
}

#endif
