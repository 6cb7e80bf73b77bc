"""The machine's own limits, measured in the benchmark's invocation: how fast it streams memory and how fast it
multiplies float32 matrices, and the model's bytes and FLOPs they bound.

At batch 1 every decoded token reads all the weights of the linear layers and the LM head from memory, so
weights' bytes over the streaming rate is the least time per output token; a prompt's FLOPs over the
matmul rate is the least time to first token. Both rates are the best of several timed runs on all of
PyTorch's threads, so other work on a shared machine lowers them less than it would one run.
"""
from __future__ import annotations

import time
from typing import Any, Callable

REPEATS = 7
# The matmul timed: a prefill chunk of 2048 tokens through the default model's gate-up projection.
MATMUL_SHAPE = (2048, 576, 3072)


def default_model_weight_bytes(bytes_per_weight: int = 4) -> int:
    """Bytes of weights a decode step of the default model reads (4 per weight in float32, 2 in bfloat16, 1
    in int8): every linear layer and the LM head (the embedding lookup reads one row)."""
    from pagedllm.model.gguf_loader import read_gguf_config
    from pagedllm.model.source import default_model_path

    c = read_gguf_config(default_model_path())
    head_dim = c.hidden_size // c.num_attention_heads
    per_layer = c.hidden_size * (2 * c.hidden_size + 2 * c.num_key_value_heads * head_dim + 3 * c.intermediate_size)
    return bytes_per_weight * (c.num_hidden_layers * per_layer + c.hidden_size * c.vocab_size)


def stream_rate(nbytes: int, device: str = "cpu") -> float:
    """Bytes per second of a streaming read (a sum) over a float32 buffer of `nbytes`, larger than any cache."""
    return stream_timer(nbytes, device)()


def stream_timer(nbytes: int, device: str = "cpu", repeats: int = REPEATS) -> Callable[[], float]:
    """A function that measures the streaming rate (as stream_rate) over a buffer it keeps, so that it can be
    measured again and again, between the runs of a benchmark, without allocating each time."""
    import torch

    buffer = torch.ones(nbytes // 4, device=device)
    return lambda: buffer.numel() * 4 / _best_time(buffer.sum, device, repeats)


def _best_time(run: Any, device: str, repeats: int = REPEATS) -> float:
    """The least seconds of run() over the repeats, after one untimed run (pages faulted in, kernels loaded);
    on CUDA each timed run waits for the GPU."""
    import torch

    wait = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    run()
    wait()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        wait()
        best = min(best, time.perf_counter() - start)
    return best


def matmul_rate(device: str = "cpu", shape: tuple[int, int, int] = MATMUL_SHAPE) -> float:
    """FLOP/s of an [m, k] x [k, n] matmul (default: prefill-sized) on PyTorch's default path: float32 on CPU
    (MKL), bfloat16 on CUDA (the dtypes pagedllm runs there by default)."""
    import torch

    m, k, n = shape
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    a, b = torch.randn(m, k, dtype=dtype, device=device), torch.randn(k, n, dtype=dtype, device=device)
    return 2 * m * k * n / _best_time(lambda: a @ b, device)


def measure_limits(bytes_per_weight: int = 4, device: str = "cpu") -> dict[str, Any]:
    """The machine's rates on `device` and the default model's weights' size (run in a child process of its
    own)."""
    import torch

    weight_bytes = default_model_weight_bytes(bytes_per_weight)
    return {"weight_bytes": weight_bytes, "stream_bytes_per_s": round(stream_rate(weight_bytes, device)),
            "matmul_flops_per_s": round(matmul_rate(device)), "threads": torch.get_num_threads(),
            "device": device}


def cpu_flags() -> list[str]:
    """The vector-extension flags of this CPU that decide which kernels it can run (AVX2, AVX-512, AMX, ...)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return []
    return sorted(flag for flag in flags if flag.startswith(("avx", "amx", "fma")))
