"""llama.cpp as a batch-1 baseline on the default model's own GGUF file, through llama-cpp-python run by the
user's own interpreter in a separate environment (never a dependency of pagedllm).

The parent side (`run_llama_cpp`, called by latency.py under pagedllm's interpreter) runs this file with the
given interpreter on the same token-id prompts. The child side (`main`, run under that interpreter) imports
only llama_cpp and the standard library; like latency.py it runs the prompts one at a time after one warm-up
prompt, greedy, `output_len` tokens each whatever they are (end of text included), on one thread per core,
and prints the median TTFT and TPOT and each prompt's tokens as one JSON line. llama.cpp multiplies Q4_1
weights by activations it rounds to 8 bits, so its tokens may part from pagedllm's (and transformers') after
a while; the parent reports how many agree.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from typing import Any

_RESULT_PREFIX = "LLAMA_CPP_RESULT "


def run_llama_cpp(python: str, prompts: list[list[int]], output_len: int) -> dict[str, Any]:
    """llama.cpp's figures on these prompts (the first a warm-up), from a subprocess of `python` (an
    interpreter with llama-cpp-python installed)."""
    from benchmarks.common import run_baseline_script
    from pagedllm.model.source import default_model_path

    job = {"model": default_model_path(), "prompts": prompts, "output_len": output_len,
           "threads": os.cpu_count() or 1}
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # its own environment, not pagedllm's
    return run_baseline_script(python, os.path.abspath(__file__), job, env, "llama.cpp", _RESULT_PREFIX)


def main(job_path: str) -> None:
    """Run under llama-cpp-python's interpreter: generate the job's prompts one at a time and print the figures."""
    import llama_cpp

    with open(job_path) as f:
        job = json.load(f)
    output_len = job["output_len"]
    longest = max(len(p) for p in job["prompts"]) + output_len
    start = time.perf_counter()
    llm = llama_cpp.Llama(model_path=job["model"], n_ctx=longest, n_threads=job["threads"],
                          n_threads_batch=job["threads"], n_batch=longest, verbose=False)
    startup_s = time.perf_counter() - start
    runs, tokens = [], []
    for prompt in job["prompts"]:
        llm.reset()  # no prompt reuses the last one's cache
        out: list[int] = []
        begin = time.perf_counter()
        first = 0.0
        for token in llm.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
            if not out:
                first = time.perf_counter()
            out.append(int(token))
            if len(out) == output_len:
                break
        end = time.perf_counter()
        runs.append({"ttft_s": first - begin, "tpot_s": (end - first) / (output_len - 1)})
        tokens.append(out)
    timed = runs[1:]  # the first prompt warms up
    print(_RESULT_PREFIX + json.dumps({
        "llama_cpp_version": llama_cpp.__version__, "threads": job["threads"], "startup_s": round(startup_s, 2),
        "ttft_s": round(statistics.median(r["ttft_s"] for r in timed), 4),
        "tpot_s": round(statistics.median(r["tpot_s"] for r in timed), 4),
        "repeats": [{k: round(v, 4) for k, v in r.items()} for r in timed], "output_token_ids": tokens[1:]}))


if __name__ == "__main__":
    main(sys.argv[1])
