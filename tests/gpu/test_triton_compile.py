"""The Triton attention kernel compiles for NVIDIA GPUs (Hopper, Ampere) in the dtypes the engine runs, decode
and prefill: Triton lowers it to PTX and assembles it with its own ptxas, no GPU needed. The interpreter
(test_triton_attention.py) checks what the kernel computes; this checks that the compiler accepts it."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("triton")

# Run in a fresh interpreter: the kernel must be defined without TRITON_INTERPRET, which the attention tests set.
SCRIPT = r"""
import torch, triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from pagedllm.model.triton_attention import kernel_arguments, tokens_per_tile
from pagedllm.model.triton_paged_kernel import paged_attention_kernel

NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int64: "i64",
         torch.int32: "i32"}

def type_of(value):
    if isinstance(value, torch.Tensor):
        return "*" + NAMES[value.dtype]
    return "fp32" if isinstance(value, float) else "i32"

heads, kv_heads, dim, block = 9, 3, 64, 16  # the default model's attention
for dtype in (torch.bfloat16, torch.float32):
    qkv = torch.zeros(40, heads + 2 * kv_heads, dim, dtype=dtype)
    cache = tuple(torch.zeros(kv_heads, 8, block, dim, dtype=dtype) for _ in range(2))
    tables = torch.zeros(4, 8, dtype=torch.long)
    for decode, meta in ((True, torch.ones(4, dtype=torch.long)), (False, torch.ones(4, 3, dtype=torch.int32))):
        args, constants = kernel_arguments(qkv[:, :heads], cache, torch.zeros(40, heads, dim, dtype=dtype), tables,
                                           meta, decode, 0, 0.125)
        names = paged_attention_kernel.arg_names
        signature = {name: type_of(value) for name, value in zip(names, args)} | {c: "constexpr" for c in constants}
        constexprs = {(names.index(c),): v for c, v in constants.items()}
        for capability in (90, 80):
            compiled = triton.compile(ASTSource(paged_attention_kernel, signature, constexprs),
                                      target=GPUTarget("cuda", capability, 32))
            assert compiled.asm["cubin"], (dtype, decode, capability)
            print(dtype, "decode" if decode else "prefill", f"sm_{capability}", "compiled")
"""


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the kernel tests compile and run it")
def test_kernel_compiles_for_nvidia_gpus():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), env.get("PYTHONPATH", "")])
    result = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("compiled") == 8
