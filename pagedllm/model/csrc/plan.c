/* Replays a recorded plan of kernel calls (worker/cpu_graph.py): the decode step of a small batch is a few
 * hundred kernel calls whose Python dispatch, measured at about 3 ms per step on the default model, costs
 * more than all its element-wise work and attention together; replayed here it costs microseconds. */
#include <stdint.h>

typedef void (*entry_point)(const int64_t *args);

void run_plan(const entry_point *entries, const int64_t *const *arguments, int64_t calls) {
    for (int64_t i = 0; i < calls; i++) entries[i](arguments[i]);
}
