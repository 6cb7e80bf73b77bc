/* A parallel region's items split among its threads so that no thread waits long for another that other work
 * on the machine holds up: each thread owns a contiguous share of the items and takes them from its front, in
 * order; a thread whose share is done takes items from the back of the others' shares (work stealing). With
 * every thread running at the same pace, each does its own share, as a static split would. Which thread runs
 * an item never changes what the item computes.
 *
 * Measured on a 2-core AMD Zen 3 loaded by other processes: a static split made a call wait for its slowest
 * thread, whose core was often busy with other work.
 */
#ifndef PAGEDLLM_WORK_SHARES_H
#define PAGEDLLM_WORK_SHARES_H

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

typedef struct {
    /* The share's next item from the front (low 32 bits) and its end (high 32 bits). */
    _Atomic uint64_t bounds;
    char padding[64 - sizeof(uint64_t)]; /* a cache line each: owners update theirs without sharing lines */
} work_share;

/* `count` shares of `items` items (fewer than 2^32), contiguous and as even as can be. */
static inline void work_shares_init(work_share *shares, int64_t count, int64_t items) {
    for (int64_t t = 0; t < count; t++) {
        const uint64_t first = items * t / count, last = items * (t + 1) / count;
        atomic_store_explicit(&shares[t].bounds, first | last << 32, memory_order_relaxed);
    }
}

/* Takes up to `most` items from the front (from_back 0) or the back of a share: returns the first taken and sets
 * *taken, or returns -1 where the share is empty. */
static inline int64_t work_share_take(work_share *share, int64_t most, int from_back, int64_t *taken) {
    uint64_t bounds = atomic_load_explicit(&share->bounds, memory_order_relaxed);
    for (;;) {
        const uint64_t front = bounds & 0xffffffffu, back = bounds >> 32;
        if (front >= back)
            return -1;
        const uint64_t n = back - front < (uint64_t)most ? back - front : (uint64_t)most;
        const uint64_t next = from_back ? front | (back - n) << 32 : (front + n) | back << 32;
        if (atomic_compare_exchange_weak_explicit(&share->bounds, &bounds, next, memory_order_relaxed,
                                                  memory_order_relaxed)) {
            *taken = (int64_t)n;
            return (int64_t)(from_back ? back - n : front);
        }
    }
}

/* The next items for thread `me` of `count` shares: up to `most` from the front of its own share, else from the
 * back of the next share that has any. Returns the first and sets *taken, or -1 once all are done. */
static inline int64_t work_shares_next(work_share *shares, int64_t count, int64_t me, int64_t most,
                                       int64_t *taken) {
    for (int64_t i = 0; i < count; i++) {
        const int64_t first = work_share_take(&shares[(me + i) % count], most, i > 0, taken);
        if (first >= 0)
            return first;
    }
    return -1;
}

/* At least `count` shares of the calling thread's, kept between calls (a region's shares are set by the thread
 * that starts it, before it starts). */
static inline work_share *work_shares(int64_t count) {
    static __thread work_share *shares;
    static __thread int64_t capacity;
    if (capacity < count) {
        free(shares);
        shares = aligned_alloc(64, sizeof(work_share) * count);
        capacity = count;
    }
    return shares;
}

#endif
