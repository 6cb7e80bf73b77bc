"""Where a decode step's time goes at several batch sizes, on the `throughput` workload's prompts.

    python benchmarks/decode_profile.py                      # 16, 32 and 64 sequences
    python benchmarks/decode_profile.py --batch-sizes 64 --output-len 32

For each batch size, that many of the workload's prompts are prefilled, then each decode step is split into
exclusive times: linear layers, the LM head, attention, element-wise kernels, embedding, sampling, batch
layout, the model's own Python, the rest of the model runner, and the engine around it (scheduler, output
processing, detokenization). Also the attention kernel's effective rate of KV cache read (keys and values of
every context token, per layer). Timers wrap the Python calls, so they add a few microseconds per kernel call,
and the steps run eagerly: a CPU graph replays its kernel calls from C, where no timer sees them.

On a machine shared with other work, `--threads 1 --clock cpu` gives the cleanest split: each part's CPU time
on the one thread, which other processes stretch far less than wall time (they still share the memory).
"""
from __future__ import annotations

import argparse
import collections
import functools
import os
import sys
import time
from typing import Any, Callable, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import load_workload, machine_info, token_prompts, write_result  # noqa: E402

KERNEL_PARTS = {"paged_attention_rows": "attention", "packed_linear_f32": "linear", "packed_linear_i8": "linear",
                "packed_linear_bf16": "linear", "packed_linear_blocks": "linear",
                "add_rms_norm": "elementwise", "rope_and_cache": "elementwise", "silu_and_mul": "elementwise"}


class ExclusiveTimer:
    """Time spent in wrapped calls, each part's own time without the wrapped calls made inside it."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.seconds: dict[str, float] = collections.defaultdict(float)
        self.kv_bytes = 0
        self._stack: list[list] = []  # [part, time spent in wrapped callees]

    def wrap(self, part: Callable[..., str], fn: Callable) -> Callable:
        """fn, timed under the part named by part(*args) (a call inside the LM head counts as the LM head)."""

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            name = part(*args)
            if self._stack and self._stack[-1][0] == "lm_head":
                name = "lm_head"
            self._stack.append([name, 0.0])
            start = self.clock()
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = self.clock() - start
                _, inner = self._stack.pop()
                self.seconds[name] += elapsed - inner
                if self._stack:
                    self._stack[-1][1] += elapsed

        return timed


def instrument(timer: ExclusiveTimer) -> None:
    """Wrap the kernels and the stages of a step (before any engine is built: the kernel loaders are cached)."""
    from pagedllm.engine.llm_engine import LLMEngine
    from pagedllm.model import cpu_kernels, llama
    from pagedllm.sample import sampler
    from pagedllm.sample.metadata import SamplingMetadata
    from pagedllm.worker import model_runner

    kernel_init, kernel_call = cpu_kernels.Kernel.__init__, cpu_kernels.Kernel.__call__

    def named_init(self: Any, library: Any, name: str) -> None:
        kernel_init(self, library, name)
        self.part = KERNEL_PARTS.get(name, name)

    def counted_call(self: Any, *args: Any) -> None:
        if self.part == "attention":  # (q, k_cache, v_cache, out, tables, row_tables, lens, ...)
            k_cache, lens = args[1], args[6]
            timer.kv_bytes += 2 * int(lens.sum()) * k_cache.shape[0] * k_cache.shape[-1] * k_cache.element_size()
        kernel_call(self, *args)

    cpu_kernels.Kernel.__init__ = named_init
    cpu_kernels.Kernel.__call__ = timer.wrap(lambda self, *a: self.part, counted_call)
    model = llama.LlamaForCausalLM
    model.compute_logits = timer.wrap(lambda *a: "lm_head", model.compute_logits)
    model.embed = timer.wrap(lambda *a: "embed", model.embed)
    model.forward_stage = timer.wrap(lambda *a: "model_python", model.forward_stage)
    sampler.Sampler.__call__ = timer.wrap(lambda *a: "sampling", sampler.Sampler.__call__)
    SamplingMetadata.build = staticmethod(timer.wrap(lambda *a: "sampling", SamplingMetadata.build))
    model_runner.build_model_input = timer.wrap(lambda *a: "batch_layout", model_runner.build_model_input)
    runner = model_runner.ModelRunner
    runner.execute_model = timer.wrap(lambda *a: "runner_other", runner.execute_model)
    LLMEngine.step = timer.wrap(lambda *a: "engine_other", LLMEngine.step)


def profile_batch(llm: Any, timer: ExclusiveTimer, prompts: list[list[int]], output_len: int) -> dict[str, Any]:
    """Prefill `prompts`, then time every decode step; times are per step, in milliseconds."""
    from pagedllm import SamplingParams, TokensPrompt

    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(f"p{output_len}-{len(prompts)}-{i}", TokensPrompt(prompt_token_ids=prompt), params)
    while not all(r.request.num_computed_tokens >= r.request.num_prompt_tokens for r in engine.requests.values()):
        engine.step()
    timer.seconds.clear()
    timer.kv_bytes = 0
    steps, start = 0, timer.clock()
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    elapsed = timer.clock() - start
    parts = {name: 1000 * s / steps for name, s in sorted(timer.seconds.items(), key=lambda kv: -kv[1])}
    total = sum(parts.values())
    attention_s = timer.seconds.get("attention", 0.0)
    return {"sequences": len(prompts), "decode_steps": steps, "step_ms": round(1000 * elapsed / steps, 2),
            "parts_ms": {k: round(v, 2) for k, v in parts.items()},
            "parts_share": {k: round(v / total, 3) for k, v in parts.items()},
            "attention_kv_gb_per_s": round(timer.kv_bytes / attention_s / 1e9, 1) if attention_s else None,
            "output_tokens_per_s": round(steps * len(prompts) / elapsed, 1)}


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-sizes", default="16,32,64")
    parser.add_argument("--threads", type=int, default=None, help="PyTorch and kernel threads (default: PyTorch's)")
    parser.add_argument("--clock", default="wall", choices=["wall", "cpu"],
                        help="wall time, or the main thread's CPU time (meaningful with --threads 1)")
    parser.add_argument("--output-len", type=int, default=None, help="decode steps (default: the workload's)")
    parser.add_argument("--workloads-file", default=None, help="workloads.json (default: ../shared/bench)")
    parser.add_argument("--output", default=None, help="JSON file (default: benchmarks/results/decode_profile-<time>.json)")
    args = parser.parse_args(argv)
    workload = load_workload("throughput", args.workloads_file)
    output_len = args.output_len or workload["output_len"]
    sizes = [int(s) for s in args.batch_sizes.split(",")]
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    timer = ExclusiveTimer(time.thread_time if args.clock == "cpu" else time.perf_counter)
    instrument(timer)
    from pagedllm import LLM

    llm = LLM(enforce_eager=True)
    prompts = token_prompts(workload, max(sizes))
    profile_batch(llm, timer, prompts[:2], 4)  # warm-up: kernel builds, first-call costs
    rows = []
    for size in sizes:
        row = profile_batch(llm, timer, prompts[:size], output_len)
        print(f"{size} sequences: {row['step_ms']} ms/step, attention KV read {row['attention_kv_gb_per_s']} GB/s; "
              + ", ".join(f"{k} {v:.0%}" for k, v in row["parts_share"].items()), flush=True)
        rows.append(row)
    result = {"workload": "throughput", "input_len": workload["input_len"], "output_len": output_len,
              "threads": torch.get_num_threads(), "clock": args.clock,
              "machine": machine_info(), "by_batch_size": rows}
    print(f"wrote {write_result(result, args.output, 'decode_profile')}")
    return result


if __name__ == "__main__":
    main()
