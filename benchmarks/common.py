"""What the benchmarks share: the workloads, the Hugging Face reference model, peak memory, result files.

Each engine runs in its own child process so that its peak RSS is its own and one engine's warm caches
do not help or hurt the other; both run in the same invocation, so their ratio is meaningful on a busy
machine where absolute figures are not.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import resource
import sys
import time
from typing import Any, Callable, Optional

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS_DIR = os.path.join(REPO_ROOT, "benchmarks", "results")


def load_workload(name: str, path: Optional[str] = None) -> dict[str, Any]:
    path = path or os.environ.get("PAGEDLLM_BENCH_WORKLOADS") or _find_workloads()
    with open(path) as f:
        workloads = json.load(f)
    if name not in workloads:
        raise ValueError(f"Workload {name!r} is not defined in {path}.")
    return workloads[name]


def _find_workloads() -> str:
    """shared/bench/workloads.json in the nearest folder above the checkout that has one."""
    folder = REPO_ROOT
    while os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)
        candidate = os.path.join(folder, "shared", "bench", "workloads.json")
        if os.path.isfile(candidate):
            return candidate
    raise FileNotFoundError("No shared/bench/workloads.json above the checkout; pass --workloads-file.")


def token_prompts(workload: dict[str, Any], num_prompts: int) -> list[list[int]]:
    """The workload's token-id prompts, drawn exactly as workloads.json prescribes."""
    rng = np.random.default_rng(workload["seed"])
    ids = rng.integers(workload["token_id_low"], workload["token_id_high"], size=(num_prompts, workload["input_len"]))
    return ids.tolist()


def peak_rss_mib() -> float:
    """This process's peak resident set size (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def decoder_flops(num_layers: int, hidden: int, intermediate: int, heads: int, kv_heads: int, vocab: int,
                  input_len: int, output_len: int) -> float:
    """Multiply-add FLOPs of one request: the prompt without the LM head except on its last token, then
    output_len - 1 decode steps with it, attention included."""
    head_dim = hidden // heads
    linear = 2 * num_layers * hidden * (hidden + 2 * kv_heads * head_dim + hidden + 3 * intermediate)
    lm_head = 2 * hidden * vocab

    def attention(context: int) -> float:  # QK^T and PV for one query token over `context` keys
        return 4 * num_layers * heads * head_dim * context

    prefill = input_len * linear + sum(attention(c + 1) for c in range(input_len)) + lm_head
    decode = sum(linear + lm_head + attention(input_len + i + 1) for i in range(1, output_len))
    return float(prefill + decode)


def default_model_flops(input_len: int, output_len: int) -> float:
    from pagedllm.model.gguf_loader import read_gguf_config
    from pagedllm.model.source import default_model_path

    c = read_gguf_config(default_model_path())
    return decoder_flops(c.num_hidden_layers, c.hidden_size, c.intermediate_size, c.num_attention_heads,
                         c.num_key_value_heads, c.vocab_size, input_len, output_len)


def load_hf_model(device: str = "cpu") -> Any:
    """Hugging Face's LlamaForCausalLM on the same GGUF weights, without accelerate: dequantized to float32 on
    CPU, in bfloat16 on CUDA (pagedllm's default dtype on each)."""
    import torch
    from transformers import AutoConfig, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from pagedllm.model.source import default_model_path

    folder, file = os.path.split(default_model_path())
    config = AutoConfig.from_pretrained(folder, gguf_file=file)
    model = LlamaForCausalLM(config)
    state = load_gguf_checkpoint(os.path.join(folder, file), return_tensors=True, model_to_load=model)["tensors"]
    model.load_state_dict({k: torch.as_tensor(v) for k, v in state.items()}, strict=False)
    model.tie_weights()
    return model.to(device=device, dtype=torch.bfloat16 if device == "cuda" else torch.float32).eval()


def common_prefix_lengths(a: list[list[int]], b: list[list[int]]) -> list[int]:
    """Per request, how many leading output tokens two runs' greedy outputs share."""
    return [next((i for i, (p, q) in enumerate(zip(x, y)) if p != q), min(len(x), len(y))) for x, y in zip(a, b)]


def decode_weight_bytes(engine: Any) -> Optional[int]:
    """Bytes of weights one decode step of an in-process engine's model reads: its linear layers and LM head as
    the engine holds them (float32, bfloat16, int8 and its scales, or 4- and 8-bit blocks; an embedding lookup
    reads one row). None where the model runs in another process."""
    from pagedllm.model.layers import linear_weight_bytes

    worker = getattr(engine.model_executor, "worker", None)
    return None if worker is None else linear_weight_bytes(worker.model_runner.model)


def run_baseline_script(python: str, script: str, job: dict[str, Any], env: dict[str, str], name: str,
                        prefix: str) -> dict[str, Any]:
    """The figures a baseline's child side (`script`, run by `python`, the interpreter of the baseline's own
    environment, with `env`) prints as JSON after `prefix`, given `job` as a JSON file named by its one
    argument; an error with the end of its stderr where it fails."""
    import subprocess
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(job, f)
    try:
        done = subprocess.run([python, script, f.name], env=env, capture_output=True, text=True)
    finally:
        os.remove(f.name)
    lines = [line for line in done.stdout.splitlines() if line.startswith(prefix)]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{name} under {python} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(lines[-1][len(prefix):])


def run_in_child(target: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """target(*args) in a fresh process; its result dict gains that process's peak RSS."""
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        return pool.apply(_measured, (target, *args))


def _measured(target: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    import torch

    threads = os.environ.get("PAGEDLLM_BENCH_THREADS")
    if threads:
        torch.set_num_threads(int(threads))
    result = target(*args)
    result["peak_rss_mib"] = round(peak_rss_mib(), 1)
    result["torch_threads"] = torch.get_num_threads()
    return result


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quantization", default=None, choices=["int8"], help="pagedllm's weight quantization")
    parser.add_argument("--device", default=None, choices=["cpu", "cuda"],
                        help="where pagedllm and the transformers baseline run (default: CUDA where there is one)")
    parser.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="an extra EngineArgs keyword for pagedllm, the value as JSON or text (repeatable)")


def parse_engine_args(args: argparse.Namespace) -> dict[str, Any]:
    kwargs = parse_pairs(args.engine_arg)
    if args.quantization:
        kwargs["quantization"] = args.quantization
    if args.device:
        kwargs["device"] = args.device
    return kwargs


def benchmark_device(args: argparse.Namespace) -> str:
    """The device the engines run on: --device, else CUDA where there is one (as pagedllm's device="auto")."""
    import torch

    return args.device or ("cuda" if torch.cuda.is_available() else "cpu")


def parse_pairs(items: list[str]) -> dict[str, Any]:
    """KEY=VALUE items as keyword arguments, each value parsed as JSON where it is JSON, else kept as text."""
    kwargs: dict[str, Any] = {}
    for item in items:
        key, _, value = item.partition("=")
        try:
            kwargs[key.replace("-", "_")] = json.loads(value)
        except json.JSONDecodeError:
            kwargs[key.replace("-", "_")] = value
    return kwargs


def machine_info() -> dict[str, Any]:
    import torch

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {"cpu": _cpu_name(), "cpu_count": os.cpu_count(), "gpu": gpu, "python": platform.python_version(),
            "torch": torch.__version__, "load_average": os.getloadavg()}


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def write_result(result: dict[str, Any], output: Optional[str], stem: str) -> str:
    result["timestamp"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    result["command"] = " ".join([os.path.basename(sys.executable)] + sys.argv)
    if output is None:
        os.makedirs(RESULTS_DIR, exist_ok=True)
        output = os.path.join(RESULTS_DIR, f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}.json")
    else:
        os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    with open(output, "w") as f:
        json.dump(result, f, indent=2)
    return output
