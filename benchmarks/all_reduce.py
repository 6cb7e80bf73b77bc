"""The tensor-parallel all-reduce on CPU: gloo's against the shared-memory one (distributed/shared_memory_reduce.py)
between worker processes of this machine, at the default model's hidden size, in one invocation.

    python benchmarks/all_reduce.py                  # 2 and 3 ranks; rows 1, 4, 64 (decode) and 2048 (prefill)
    python benchmarks/all_reduce.py --ranks 2 --rows 1,16

A decode step of the default model runs 60 of them (two per layer). The two take turns in each rank, each
keeping its least time per call over several rounds, so that other work on the machine stretches the
figures less; the ratio is gloo's time over shared memory's.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from benchmarks.common import machine_info, write_result  # noqa: E402
from pagedllm.distributed import ParallelRanks, destroy_distributed, free_port, init_distributed  # noqa: E402

HIDDEN = 576  # SmolLM2-135M


def _time_per_call(reduce: Any, x: torch.Tensor, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        reduce(x)
    return (time.perf_counter() - start) / calls


def _rank_main(rank: int, world: int, port: int, rows: list[int], rounds: int, results: Any) -> None:
    torch.set_num_threads(1)
    parallel = init_distributed(ParallelRanks.from_rank(rank, world, 1), f"tcp://127.0.0.1:{port}")
    tp = parallel.tp
    paths = {"gloo": lambda x: dist.all_reduce(x, group=tp.group), "shared_memory": tp.shared_memory}
    try:
        for n in rows:
            x = torch.randn(n, HIDDEN)
            calls = max(3, min(500, 200_000 // n))
            best = {name: float("inf") for name in paths}
            for _ in range(rounds):
                for name, reduce in paths.items():
                    best[name] = min(best[name], _time_per_call(reduce, x, calls))
            if rank == 0:
                results.append({"ranks": world, "rows": n, "gloo_us": best["gloo"] * 1e6,
                                "shared_memory_us": best["shared_memory"] * 1e6,
                                "ratio": best["gloo"] / best["shared_memory"]})
    finally:
        destroy_distributed()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", default="2,3", help="comma-separated world sizes")
    parser.add_argument("--rows", default="1,4,64,2048", help="comma-separated rows of the summed tensor")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    rows = [int(n) for n in args.rows.split(",")]
    results = mp.Manager().list()
    for world in (int(n) for n in args.ranks.split(",")):
        mp.spawn(_rank_main, args=(world, free_port(), rows, args.rounds, results), nprocs=world)
    print(f"{'ranks':>5} {'rows':>5} {'gloo us':>10} {'shm us':>10} {'ratio':>7}")
    for r in results:
        print(f"{r['ranks']:>5} {r['rows']:>5} {r['gloo_us']:>10.1f} {r['shared_memory_us']:>10.1f} "
              f"{r['ratio']:>6.1f}x")
    path = write_result({"machine": machine_info(), "hidden": HIDDEN, "results": list(results)}, args.output,
                        "all_reduce")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
