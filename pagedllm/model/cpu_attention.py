"""The CPU paged-attention kernel (csrc/paged_attention.c): compiled on first use for the model's shape,
cached on disk, called through ctypes.

PyTorch has no attention that reads a paged cache in place; gathering each sequence's blocks into a
contiguous copy every step costs more than the attention itself. The kernel is plain C with OpenMP and
links PyTorch's own OpenMP runtime, so it shares PyTorch's threads. Where no C compiler is found, or it
fails, `load_kernel` returns None and attention falls back to gathering in PyTorch.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from typing import Callable, Optional

import torch

logger = logging.getLogger(__name__)

_SOURCE = os.path.join(os.path.dirname(__file__), "csrc", "paged_attention.c")
_CACHE_DIR = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "pagedllm", "kernels")
# -ffast-math lets the compiler vectorize the reductions and exp; the kernel never relies on inf or NaN.
_FLAGS = ["-O3", "-march=native", "-ffast-math", "-fopenmp", "-shared", "-fPIC"]

# (q, k_cache, v_cache, block_tables, row_seqs, row_lens, scale) -> out
Kernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float],
                  torch.Tensor]


@functools.cache
def load_kernel(group: int, head_dim: int, block_size: int) -> Optional[Kernel]:
    """The kernel for this shape of model and cache, or None where it cannot be built."""
    compiler = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        logger.warning("No C compiler found: CPU attention gathers blocks in PyTorch (slower).")
        return None
    defines = [f"-DGROUP={group}", f"-DHEAD_DIM={head_dim}", f"-DBLOCK_SIZE={block_size}"]
    try:
        library = ctypes.CDLL(_build(compiler, defines))
    except (OSError, subprocess.CalledProcessError) as error:
        detail = error.stderr.decode(errors="replace") if isinstance(error, subprocess.CalledProcessError) else error
        logger.warning("Building the CPU attention kernel failed (%s): attention gathers blocks in PyTorch.", detail)
        return None
    function = library.paged_attention_rows
    function.argtypes = [ctypes.c_void_p] * 7 + [ctypes.c_int64] * 4 + [ctypes.c_float]
    function.restype = None

    def run(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
            row_seqs: torch.Tensor, row_lens: torch.Tensor, scale: float) -> torch.Tensor:
        q = q.contiguous()
        out = torch.empty_like(q)
        function(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), out.data_ptr(), block_tables.data_ptr(),
                 row_seqs.data_ptr(), row_lens.data_ptr(), q.shape[0], k_cache.shape[0], k_cache.shape[1],
                 block_tables.shape[1], scale)
        return out

    return run


def _build(compiler: str, defines: list[str]) -> str:
    """Compile into the cache unless this source, these flags and this CPU were already built for."""
    with open(_SOURCE, "rb") as f:
        source = f.read()
    key = hashlib.sha256(b"\0".join([source, " ".join([compiler, *_FLAGS, *defines]).encode(),
                                     _cpu_signature().encode()])).hexdigest()[:16]
    path = os.path.join(_CACHE_DIR, f"paged_attention-{key}.so")
    if os.path.exists(path):
        return path
    os.makedirs(_CACHE_DIR, exist_ok=True)
    torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib")  # PyTorch's libgomp, not a second runtime
    fd, partial = tempfile.mkstemp(dir=_CACHE_DIR, suffix=".so")
    os.close(fd)
    try:
        subprocess.run([compiler, *_FLAGS, *defines, _SOURCE, "-o", partial, f"-L{torch_lib}",
                        f"-Wl,-rpath,{torch_lib}"], check=True, capture_output=True)
        os.replace(partial, path)  # atomic: processes building at once never load a half-written file
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    return path


def _cpu_signature() -> str:
    """-march=native code runs only on this CPU model: key the build by it."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [line for line in f if line.startswith(("model name", "flags"))]
        return platform.machine() + "".join(sorted(set(lines)))
    except OSError:
        return platform.machine() + platform.processor()
