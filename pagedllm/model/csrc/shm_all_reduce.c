/* The sum of one float32 tensor over the tensor-parallel ranks of one machine, through a shared segment
 * (distributed/shared_memory_reduce.py). Each rank copies its part into its slot, marks its arrival with the
 * call's generation, waits for every other rank's mark, and sums the slots in rank order: every rank computes
 * the same sums in the same order, so all hold the same bits.
 *
 * The segment holds one cache line per rank (its last generation), then two sets of slots, one per parity of
 * the generation. A rank writes the set of generation g + 2 only after every rank has arrived at g + 1, which
 * each does only after reading the set of g: two sets are enough, and no second barrier is needed.
 */
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#define LINE_BYTES 64
/* Waits spin this many times before they yield the core: ranks may share fewer cores than there are ranks. */
#define SPINS_BEFORE_YIELD 64

static inline void relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static double seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static inline uint64_t *arrival(char *segment, int64_t rank) { return (uint64_t *)(segment + rank * LINE_BYTES); }

/* x [count] (count at most slot_floats) summed over the world's ranks, in place. Returns -1, or the first rank
 * that had not arrived within timeout_s. */
int64_t shm_all_reduce(char *segment, int64_t rank, int64_t world, int64_t slot_floats, uint64_t generation,
                       float *x, int64_t count, double timeout_s) {
    float *slots = (float *)(segment + world * LINE_BYTES) + (generation & 1) * world * slot_floats;
    memcpy(slots + rank * slot_floats, x, count * sizeof(float));
    __atomic_store_n(arrival(segment, rank), generation, __ATOMIC_RELEASE);
    double deadline = 0.0;
    for (int64_t other = 0; other < world; other++)
        for (int64_t spins = 0; __atomic_load_n(arrival(segment, other), __ATOMIC_ACQUIRE) < generation; spins++) {
            if (spins < SPINS_BEFORE_YIELD) {
                relax();
                continue;
            }
            sched_yield();
            if (spins % 1024 == 0) {
                if (deadline == 0.0)
                    deadline = seconds() + timeout_s;
                else if (seconds() > deadline)
                    return other;
            }
        }
    memcpy(x, slots, count * sizeof(float));
    for (int64_t other = 1; other < world; other++) {
        const float *part = slots + other * slot_floats;
        for (int64_t i = 0; i < count; i++)
            x[i] += part[i];
    }
    return -1;
}
