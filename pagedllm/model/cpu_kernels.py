"""The C kernels of the CPU float32 path (csrc/): compiled on first use for the model's shape, cached on
disk, called through ctypes, each through an entry point that takes its arguments as one array (csrc/entry.h)
so that a step's calls can be recorded and replayed from C (plan.c, worker/cpu_graph.py).

- paged_attention.c: attention of each query token, decode or prefill, reading the paged cache in place.
  PyTorch has no attention over a paged cache; gathering each sequence's blocks into a contiguous copy every
  step costs more than the attention itself. One token per row, reduced in a fixed order, keeps results
  independent of the batch a token runs in.
- layer_ops.c: a decoder layer's element-wise steps (residual add with RMSNorm, rotary embedding with the
  cache write, SiLU-and-multiply), one call each instead of several PyTorch operators, whose dispatch
  dominates at decode.
- row_max.c: each logits row's maximum and its first index (the greedy token), several times faster than
  PyTorch's max over a dimension.
- greedy_head.c: the greedy token of each row through the LM head from an int8 approximation of every logit
  with a bound on its error, computing exactly only the vocabulary panels the bounds cannot rule out
  (greedy_head.py); on CPUs with AVX512_VNNI.
- shm_all_reduce.c: the sum of a tensor over the tensor-parallel ranks of one machine, through shared memory
  (distributed/shared_memory_reduce.py); gloo's all-reduce took milliseconds, a decode step's compute.
- packed_linear.c: linear layers over float32 or int8 weights packed in panels; faster than MKL at decode
  batch sizes, and PyTorch's own int8 matmul (`_weight_int8pack_mm`) measured 3.5 GFLOP/s on an AVX-512 CPU,
  40 times slower than its float32 matmul.

The kernels are plain C with OpenMP and link PyTorch's own OpenMP runtime, so they share PyTorch's threads.
Where no C compiler is found, or it fails, the loaders return None and the model runs PyTorch operators.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import struct
import subprocess
import tempfile
import threading
from typing import Callable, Iterator, NamedTuple, Optional, Union

import torch

logger = logging.getLogger(__name__)

_SOURCES = os.path.join(os.path.dirname(__file__), "csrc")
CACHE_ROOT = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "pagedllm")
_CACHE_DIR = os.path.join(CACHE_ROOT, "kernels")
# -ffast-math lets the compiler vectorize the reductions; the kernels never rely on inf or NaN. On CPUs with
# AVX-512, whole 512-bit vectors (GCC picks 256 by default) ran an auto-vectorized int8 matmul 1.3x faster.
_FLAGS = ["-O3", "-march=native", "-mprefer-vector-width=512", "-ffast-math", "-fopenmp", "-shared", "-fPIC"]

# (q, k_cache, v_cache, block_tables, context_lens, scale, row_tables=None, out=None) -> out
AttentionKernel = Callable[..., torch.Tensor]


class LayerOps(NamedTuple):
    """Bound functions of layer_ops.c; their signatures are those of the wrappers in load_layer_ops."""

    add_rms_norm: Callable[..., torch.Tensor]
    rope_and_cache: Callable[..., None]
    silu_and_mul: Callable[[torch.Tensor], torch.Tensor]


class Kernel:
    """A kernel's entry point (csrc/entry.h), called with the kernel's arguments in order: tensors (passed as
    their data pointers), integers, floats, or None for a null pointer. While calls are being recorded
    (`recording_calls`), each one is also appended to the recording, with the tensors it was given, which
    the recording keeps alive."""

    def __init__(self, library: ctypes.CDLL, name: str) -> None:
        self.entry = getattr(library, f"{name}_entry")
        self.entry.argtypes = [ctypes.c_void_p]
        self.entry.restype = None
        self.address: int = ctypes.cast(self.entry, ctypes.c_void_p).value

    def __call__(self, *args: Union[torch.Tensor, int, float, None]) -> None:
        words = (ctypes.c_int64 * len(args))(*map(_word, args))
        recording = getattr(_recording, "calls", None)
        if recording is not None:
            recording.append(RecordedCall(self.address, words, [a for a in args if isinstance(a, torch.Tensor)]))
        self.entry(words)


class RecordedCall(NamedTuple):
    entry: int  # address of the entry point
    words: ctypes.Array  # its arguments
    tensors: list[torch.Tensor]  # those passed as pointers, kept alive with the recording


# A recorded step of PyTorch operators (replayable): reruns them, writing the same output tensor again.
TorchStep = Callable[[], None]

_recording = threading.local()  # .calls: this thread's recording, if one is under way; .in_torch_step


@contextlib.contextmanager
def recording_calls() -> Iterator[list[Union[RecordedCall, TorchStep]]]:
    """Record every kernel call and replayable step this thread makes in this block (each still runs) into
    the yielded list."""
    if getattr(_recording, "calls", None) is not None:
        raise RuntimeError("Kernel calls are already being recorded.")
    _recording.calls = []
    try:
        yield _recording.calls
    finally:
        _recording.calls = None


def replayable(compute: Callable[[], torch.Tensor]) -> torch.Tensor:
    """compute(), a few PyTorch operators (a linear layer on oneDNN or MKL, a bias add). While calls are
    recorded it is recorded as one step that reruns it into the tensor it returned now, which the kernels
    recorded after it read; the kernels it calls itself are not recorded, as the rerun calls them."""
    calls = getattr(_recording, "calls", None)
    if calls is None:
        return compute()
    _recording.calls, _recording.in_torch_step = None, True
    try:
        out = compute()
    finally:
        _recording.calls, _recording.in_torch_step = calls, False

    def rerun() -> None:
        out.copy_(compute())

    calls.append(rerun)
    return out


def in_torch_step() -> bool:
    """Whether this thread is running a replayable step being recorded: its PyTorch operators will be rerun."""
    return getattr(_recording, "in_torch_step", False)


def _word(arg: Union[torch.Tensor, int, float, None]) -> int:
    if isinstance(arg, torch.Tensor):
        return arg.data_ptr()
    if isinstance(arg, float):
        return struct.unpack("<i", struct.pack("<f", arg))[0]
    return 0 if arg is None else arg


@functools.cache
def load_plan_runner() -> Optional[Callable[[ctypes.Array, ctypes.Array, int], None]]:
    """run_plan(entries, argument arrays, number of calls) of plan.c, or None where it cannot be built."""
    library = _load("plan.c", {})
    if library is None:
        return None
    library.run_plan.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    library.run_plan.restype = None
    return library.run_plan


@functools.cache
def load_attention_kernel(group: int, head_dim: int, block_size: int) -> Optional[AttentionKernel]:
    """Decode attention for this shape of model and cache, or None where it cannot be built."""
    library = _load("paged_attention.c", {"GROUP": group, "HEAD_DIM": head_dim, "BLOCK_SIZE": block_size})
    if library is None:
        return None
    kernel = Kernel(library, "paged_attention_rows")

    def run(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
            context_lens: torch.Tensor, scale: float, row_tables: Optional[torch.Tensor] = None,
            out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """q [R, heads, d], one query token per row, rows may be strided; each attends to the first
        context_lens [R] tokens of the sequence whose blocks are row row_tables [R] of block_tables
        [S, max_blocks] (row r where row_tables is None: one token per sequence). Writes into `out`
        [R, heads, d] (contiguous) where given."""
        if q.stride(2) != 1 or q.stride(1) != q.shape[2]:
            q = q.contiguous()
        out = q.new_empty(q.shape) if out is None else out
        kernel(q, k_cache, v_cache, out, block_tables, row_tables, context_lens, q.shape[0], q.stride(0),
               k_cache.shape[0], k_cache.shape[1], block_tables.shape[1], float(scale))
        return out

    return run


def serves(x: torch.Tensor) -> bool:
    """Whether the C kernels can take x: float32 on the CPU (they still need a compiler to load)."""
    return x.device.type == "cpu" and x.dtype == torch.float32


def layer_ops_for(x: torch.Tensor) -> Optional[LayerOps]:
    """The C layer steps where they serve x and could be built, else None."""
    return load_layer_ops() if serves(x) else None


@functools.cache
def load_layer_ops() -> Optional[LayerOps]:
    """The element-wise layer steps, or None where they cannot be built."""
    library = _load("layer_ops.c", {})
    if library is None:
        return None
    norm, rope, silu = (Kernel(library, name) for name in ("add_rms_norm", "rope_and_cache", "silu_and_mul"))

    def add_rms_norm(x: torch.Tensor, residual: Optional[torch.Tensor], weight: torch.Tensor,
                     eps: float) -> torch.Tensor:
        """norm(x) * weight over the last dimension, or, given a (contiguous) residual of x's shape,
        residual += x in place and norm(residual) * weight."""
        x = x.contiguous()
        out = torch.empty_like(x)
        norm(x, residual, weight, out, x.numel() // x.shape[-1], x.shape[-1], float(eps))
        return out

    def rope_and_cache(qkv: torch.Tensor, cos_table: torch.Tensor, sin_table: torch.Tensor, positions: torch.Tensor,
                       slots: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, heads: int) -> None:
        """Rotate qkv's query and key heads in place, at the table rows of their positions, and store its keys
        and values in their cache slots."""
        kv_heads, head_dim = k_cache.shape[0], k_cache.shape[-1]
        rope(qkv, cos_table, sin_table, positions, slots, k_cache, v_cache, qkv.shape[0], heads, kv_heads,
             k_cache.shape[1] * k_cache.shape[2], head_dim)

    def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up, where the last dimension holds gate then up."""
        gate_up = gate_up.contiguous()
        out = gate_up.new_empty(*gate_up.shape[:-1], gate_up.shape[-1] // 2)
        silu(gate_up, out, out.numel() // out.shape[-1], out.shape[-1])
        return out

    return LayerOps(add_rms_norm, rope_and_cache, silu_and_mul)


@functools.cache
def load_row_max() -> Optional[Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]]:
    """row_max(x [rows, size] float32, unit stride along size) -> (maxima [rows], first index of each [rows] long),
    as torch.max(x, dim=-1) gives them; None where the kernel cannot be built."""
    library = _load("row_max.c", {})
    if library is None:
        return None
    kernel = Kernel(library, "row_max")

    def run(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        values = x.new_empty(x.shape[0])
        indices = torch.empty(x.shape[0], dtype=torch.long)
        kernel(x, values, indices, x.shape[0], x.shape[1], x.stride(0))
        return values, indices

    return run


def load_shm_all_reduce() -> Optional[Callable[..., int]]:
    """shm_all_reduce.c's function, (segment, rank, world, slot_floats, generation, x, count, timeout_s) -> -1 or
    the rank that did not arrive; None where the kernel cannot be built."""
    library = _load("shm_all_reduce.c", {})
    if library is None:
        return None
    function = library.shm_all_reduce
    function.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint64,
                         ctypes.c_void_p, ctypes.c_int64, ctypes.c_double]
    function.restype = ctypes.c_int64
    return function


class PackedLinear(NamedTuple):
    """Bound functions of packed_linear.c. Weights [out, in] are packed as [out / panel, in, panel] (`pack`),
    which needs out to be a multiple of `panel`."""

    panel: int
    float32: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (x [rows, in], packed weight) -> x @ W.T
    int8: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]  # (x, packed int8, scales [out])
    bfloat16: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (float32 x, packed bfloat16 weight)
    # (x, weight packed in 4- or 8-bit blocks by weight_blocks.py), or None where this build has no such kernel
    blocks: Optional[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]
    # (x, 4-bit blocks packed for bfloat16 inputs): x rounded to bfloat16 times the blocks, with AVX512_BF16's dot
    # products; None where this build has no such kernel
    blocks_bf16: Optional[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]
    # Address of packed_panel_row (one row times one panel, as the layer computes it; greedy_head.c calls it), or
    # 0 in a benchmark's build of an older revision
    panel_row: int

    def pack(self, weight: torch.Tensor) -> torch.Tensor:
        """[out, in] -> [out / panel, in, panel], contiguous."""
        out, k = weight.shape
        return weight.view(out // self.panel, self.panel, k).transpose(1, 2).contiguous()


@functools.cache
def load_packed_linear() -> Optional[PackedLinear]:
    """Linear layers over panel-packed float32, int8 or bfloat16 weights, or None where they cannot be built."""
    library = _load("packed_linear.c", {})
    return packed_linear(library) if library is not None else None


def packed_linear(library: ctypes.CDLL) -> PackedLinear:
    """The linear layers of a built packed_linear.c (this package's, or a benchmark's build of another
    revision)."""
    library.panel_width.restype = ctypes.c_int64
    panel = library.panel_width()
    run_float32, run_int8 = Kernel(library, "packed_linear_f32"), Kernel(library, "packed_linear_i8")
    run_bfloat16 = Kernel(library, "packed_linear_bf16")

    def run(kernel: Kernel, x: torch.Tensor, weight: torch.Tensor, *scales: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        out = x.new_empty(x.shape[0], weight.shape[0] * weight.shape[2])
        kernel(x, weight, *scales, out, x.shape[0], out.shape[1], x.shape[1])
        return out

    blocks = blocks_bf16 = None
    if getattr(library, "block_formats", None) is not None:  # a benchmark's build of an older revision has none
        library.block_formats.restype = ctypes.c_int64
        if library.block_formats():
            blocks = functools.partial(_run_blocks, Kernel(library, "packed_linear_blocks"), panel)
    if getattr(library, "bf16_block_formats", None) is not None:
        library.bf16_block_formats.restype = ctypes.c_int64
        if library.bf16_block_formats():
            blocks_bf16 = functools.partial(_run_blocks, Kernel(library, "packed_linear_blocks_bf16"), panel)
    panel_row = getattr(library, "packed_panel_row", None)
    return PackedLinear(panel, functools.partial(run, run_float32), functools.partial(run, run_int8),
                        functools.partial(run, run_bfloat16), blocks, blocks_bf16,
                        ctypes.cast(panel_row, ctypes.c_void_p).value if panel_row is not None else 0)


def _run_blocks(kernel: Kernel, panel: int, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [rows, in] times a weight packed in blocks [out / panel, in / 32, block bytes]."""
    x = x.contiguous()
    out = x.new_empty(x.shape[0], weight.shape[0] * panel)
    kernel(x, weight, out, x.shape[0], out.shape[1], x.shape[1], weight.shape[2])
    return out


@functools.cache
def load_greedy_head() -> Optional[tuple[Kernel, int]]:
    """greedy_head.c's kernel and the panel width it reads (that of packed_linear.c's AVX-512 build), or None
    where it cannot be built or this CPU has no AVX512_VNNI for it."""
    library = _load("greedy_head.c", {})
    if library is None:
        return None
    library.greedy_head_columns.restype = ctypes.c_int64
    columns = library.greedy_head_columns()
    return (Kernel(library, "greedy_head"), columns) if columns else None


def c_compiler() -> Optional[str]:
    """The C compiler the kernels are built with: $CC, else gcc, else cc; None where there is none."""
    return os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")


def compile_library(compiler: str, source_path: str, output: str, defines: list[str]) -> None:
    """A kernel source compiled with the kernels' flags into the shared library `output`, linked to PyTorch's own
    OpenMP runtime (libgomp), not a second one."""
    torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    subprocess.run([compiler, *_FLAGS, *defines, source_path, "-o", output, f"-L{torch_lib}",
                    f"-Wl,-rpath,{torch_lib}"], check=True, capture_output=True)


def _load(source: str, defines: dict[str, int]) -> Optional[ctypes.CDLL]:
    compiler = c_compiler()
    if compiler is None:
        logger.warning("No C compiler found: the CPU path runs PyTorch operators instead of %s (slower).", source)
        return None
    try:
        return ctypes.CDLL(_build(compiler, source, [f"-D{name}={value}" for name, value in defines.items()]))
    except (OSError, subprocess.CalledProcessError) as error:
        detail = error.stderr.decode(errors="replace") if isinstance(error, subprocess.CalledProcessError) else error
        logger.warning("Building %s failed (%s): the CPU path runs PyTorch operators instead.", source, detail)
        return None


def _build(compiler: str, source: str, defines: list[str]) -> str:
    """Compile into the cache unless these sources, these flags and this CPU were already built for."""
    key = hashlib.sha256(b"\0".join([source.encode(), sources_digest().encode(),
                                     " ".join([compiler, *_FLAGS, *defines]).encode(),
                                     cpu_signature().encode()])).hexdigest()[:16]
    path = os.path.join(_CACHE_DIR, f"{os.path.splitext(source)[0]}-{key}.so")
    if os.path.exists(path):
        return path
    os.makedirs(_CACHE_DIR, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=_CACHE_DIR, suffix=".so")
    os.close(fd)
    try:
        compile_library(compiler, os.path.join(_SOURCES, source), partial, defines)
        os.replace(partial, path)  # atomic: processes building at once never load a half-written file
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    return path


@functools.cache
def sources_digest() -> str:
    """A digest of every kernel source and header: a build, or a measurement of a kernel, is stale once it changes."""
    contents = hashlib.sha256()
    for name in sorted(os.listdir(_SOURCES)):
        with open(os.path.join(_SOURCES, name), "rb") as f:
            contents.update(name.encode() + b"\0" + f.read())
    return contents.hexdigest()


def cpu_model_name() -> str:
    """The CPU's model name as /proc/cpuinfo gives it (or the platform's word for it)."""
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        return names[0] if names else platform.processor()
    except OSError:
        return platform.processor()


# CPU flags (as /proc/cpuinfo names them) of instructions that compute on bfloat16: dot products of bfloat16
# pairs into float32 (AVX512_BF16) and bfloat16 tile matmuls (AMX).
BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_bf16_flags() -> list[str]:
    """Which of BF16_FLAGS this CPU has (none where /proc/cpuinfo cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())
    except OSError:
        return []
    return [flag for flag in BF16_FLAGS if flag in flags]


def cpu_signature() -> str:
    """This CPU's model name and flags: -march=native code runs only on this CPU model, and the fastest kernel
    depends on it, so builds and measurements are keyed by it."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [line for line in f if line.startswith(("model name", "flags"))]
        return platform.machine() + "".join(sorted(set(lines)))
    except OSError:
        return platform.machine() + platform.processor()
