"""vLLM's CPU build as a baseline, run by the user's own interpreter in a separate environment (never a
dependency of pagedllm).

The parent side (`run_vllm`, called by throughput.py under pagedllm's interpreter) writes the default model
as a Hugging Face folder of float32 safetensors (the same dequantized weights pagedllm runs, once, cached),
then runs this file with the given interpreter on the same token-id prompts. The child side (`main`, run
under vLLM's interpreter) imports only vLLM and the standard library; it generates exactly as throughput.py
does for pagedllm (all requests at once, greedy, ignore_eos, one warm-up request first) and prints its figures
as one JSON line.

vLLM's CPU documentation asks for the KV cache size and the cores OpenMP threads are bound to; unless the
caller set them, VLLM_CPU_KVCACHE_SPACE is 4 (GiB) and VLLM_CPU_OMP_THREADS_BIND binds one thread to each
core of this machine. The documentation also recommends preloading TCMalloc and Intel's OpenMP
(LD_PRELOAD); the README shows how.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from typing import Any, Optional

_RESULT_PREFIX = "VLLM_RESULT "


def run_vllm(python: str, prompts: list[list[int]], output_len: int, engine_kwargs: dict[str, Any],
             child_env: Optional[dict[str, str]] = None) -> dict[str, Any]:
    """vLLM's figures on these prompts, from a subprocess of `python` (an interpreter with vLLM installed);
    `child_env` is set in that process only (LD_PRELOAD for vLLM's allocator and OpenMP, say)."""
    from benchmarks.common import run_baseline_script

    folder = export_default_model()
    env = {**os.environ, **(child_env or {})}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", f"0-{(os.cpu_count() or 1) - 1}")
    env.pop("PYTHONPATH", None)  # vLLM's own environment, not pagedllm's
    job = {"model": folder, "prompts": prompts, "output_len": output_len,
           "engine_kwargs": {"dtype": "float32", **engine_kwargs}}
    result = run_baseline_script(python, os.path.abspath(__file__), job, env, "vLLM", _RESULT_PREFIX)
    result["env"] = {k: env[k] for k in sorted(env) if k.startswith("VLLM_CPU") or k == "LD_PRELOAD"}
    return result


def export_default_model() -> str:
    """The default model as a Hugging Face folder (config, float32 safetensors, tokenizer), written once
    into pagedllm's cache."""
    from transformers import AutoTokenizer

    from benchmarks.common import load_hf_model
    from pagedllm.model.cpu_kernels import CACHE_ROOT
    from pagedllm.model.source import default_model_path

    gguf = default_model_path()
    folder = os.path.join(CACHE_ROOT, "hf-export", os.path.splitext(os.path.basename(gguf))[0])
    if os.path.exists(os.path.join(folder, "config.json")):
        return folder
    partial = tempfile.mkdtemp(dir=os.path.dirname(folder) if os.path.isdir(os.path.dirname(folder)) else None)
    load_hf_model().save_pretrained(partial, safe_serialization=True)
    AutoTokenizer.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf)).save_pretrained(partial)
    os.makedirs(os.path.dirname(folder), exist_ok=True)
    os.replace(partial, folder)  # atomic: a concurrent run never loads a half-written folder
    return folder


def main(job_path: str) -> None:
    """Run under vLLM's interpreter: generate the job's prompts and print the figures."""
    from vllm import LLM, SamplingParams

    with open(job_path) as f:
        job = json.load(f)
    prompts, output_len = job["prompts"], job["output_len"]
    start = time.perf_counter()
    llm = LLM(model=job["model"], **job["engine_kwargs"])
    startup_s = time.perf_counter() - start
    llm.generate([{"prompt_token_ids": prompts[0][:16]}],
                 SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True), use_tqdm=False)
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    start = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    elapsed = time.perf_counter() - start
    import vllm

    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    print(_RESULT_PREFIX + json.dumps({"elapsed_s": elapsed, "output_token_ids": tokens, "startup_s": startup_s,
                                       "vllm_version": vllm.__version__, "engine_args": job["engine_kwargs"]}),
          flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
