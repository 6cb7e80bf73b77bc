"""What LoRA adapters cost: the `throughput` workload with four adapters spread over its requests against the
base model, in one invocation.

One engine (enable_lora, max_loras=4) runs the workload alternately without adapters and with request i using
adapter i % 4 (base, LoRA, base, LoRA, ...), so one model copy serves both and their runs interleave. The
adapters are random, rank 16, on all seven projections, written in PEFT's format. Reports each mode's best
time, their ratio (target: LoRA at most 1.3x the base model's time) and writes the figures as JSON.

    python benchmarks/lora_throughput.py [--rounds 2] [--workloads-file PATH] [--output PATH]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.common import load_workload, machine_info, peak_rss_mib, token_prompts, write_result  # noqa: E402

TARGET_RATIO = 1.3
NUM_ADAPTERS = 4
RANK = 16
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def write_adapter(folder: str, hf_config: Any, seed: int) -> None:
    """A random rank-16 adapter of every projection of every layer, in PEFT's files."""
    import torch
    from safetensors.torch import save_file

    from pagedllm.lora.peft import projection_shape

    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(hf_config.num_hidden_layers):
        for projection in TARGETS:
            parent = "mlp" if projection in ("gate_proj", "up_proj", "down_proj") else "self_attn"
            name = f"base_model.model.model.layers.{layer}.{parent}.{projection}"
            size_in, size_out = projection_shape(projection, hf_config)
            tensors[f"{name}.lora_A.weight"] = torch.randn(RANK, size_in, generator=generator) / size_in ** 0.5
            tensors[f"{name}.lora_B.weight"] = torch.randn(size_out, RANK, generator=generator) * 0.01
    os.makedirs(folder, exist_ok=True)
    save_file(tensors, os.path.join(folder, "adapter_model.safetensors"))
    with open(os.path.join(folder, "adapter_config.json"), "w") as f:
        json.dump({"r": RANK, "lora_alpha": 2 * RANK, "target_modules": list(TARGETS), "bias": "none",
                   "peft_type": "LORA"}, f)


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    from pagedllm import LLM, LoRARequest, SamplingParams, TokensPrompt

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="runs of each mode, interleaved; the best counts")
    parser.add_argument("--workloads-file", default=None)
    parser.add_argument("--output", default=None, help="JSON file (default: benchmarks/results/<name>-<time>.json)")
    args = parser.parse_args(argv)
    workload = load_workload("throughput", args.workloads_file)
    prompts = [TokensPrompt(prompt_token_ids=p) for p in token_prompts(workload, workload["num_prompts"])]
    params = SamplingParams(temperature=0.0, max_tokens=workload["output_len"], ignore_eos=True)
    llm = LLM(enable_lora=True, max_loras=NUM_ADAPTERS, max_lora_rank=RANK)
    hf_config = llm.llm_engine.get_model_config().hf_config
    folder = tempfile.mkdtemp(prefix="pagedllm-lora-bench-")
    adapters = []
    for i in range(NUM_ADAPTERS):
        write_adapter(os.path.join(folder, f"adapter{i}"), hf_config, seed=i)
        adapters.append(LoRARequest(f"adapter{i}", i + 1, os.path.join(folder, f"adapter{i}")))
        llm.add_lora(adapters[-1])
    spread = [adapters[i % NUM_ADAPTERS] for i in range(len(prompts))]
    llm.generate(prompts[:4], SamplingParams(max_tokens=4), use_tqdm=False, lora_request=spread[:4])  # warm up
    times: dict[str, list[float]] = {"base": [], "lora": []}
    for _ in range(args.rounds):
        for mode, lora in (("base", None), ("lora", spread)):
            llm.reset_prefix_cache()
            start = time.perf_counter()
            llm.generate(prompts, params, use_tqdm=False, lora_request=lora)
            times[mode].append(time.perf_counter() - start)
            print(f"{mode}: {times[mode][-1]:.1f} s", flush=True)
    output_tokens = len(prompts) * workload["output_len"]
    best = {mode: min(t) for mode, t in times.items()}
    ratio = best["lora"] / best["base"]
    print(f"LoRA (4 adapters, rank {RANK}, 7 projections): {output_tokens / best['lora']:.1f} output tok/s; base: "
          f"{output_tokens / best['base']:.1f} output tok/s; LoRA takes {ratio:.2f}x the time (target "
          f"{TARGET_RATIO}x)", flush=True)
    result = {"workload": "throughput", "definition": workload, "machine": machine_info(),
              "adapters": {"count": NUM_ADAPTERS, "rank": RANK, "targets": list(TARGETS)},
              "seconds": times, "output_tokens_per_s": {m: round(output_tokens / t, 1) for m, t in best.items()},
              "time_ratio_lora_vs_base": round(ratio, 3), "target_time_ratio": TARGET_RATIO,
              "peak_rss_mib": round(peak_rss_mib())}
    print(f"wrote {write_result(result, args.output, 'lora_throughput')}")
    return result


if __name__ == "__main__":
    main()
