"""A kernel source (pagedllm/model/csrc/) as this checkout has it or as another git revision had it, built with
the engine's flags into a temporary folder: benchmarks time a kernel against an earlier version of itself in one
invocation, the machine's noise shared by both."""
from __future__ import annotations

import ctypes
import os
import subprocess
import tempfile

from benchmarks.common import REPO_ROOT
from pagedllm.model import cpu_kernels

CSRC = "pagedllm/model/csrc"


def revision_sources(revision: str) -> dict[str, bytes]:
    """The kernel sources (csrc/) of a git revision, by file name."""
    names = subprocess.run(["git", "ls-tree", "--name-only", f"{revision}:{CSRC}"], cwd=REPO_ROOT, check=True,
                           capture_output=True, text=True).stdout.split()
    return {name: subprocess.run(["git", "show", f"{revision}:{CSRC}/{name}"], cwd=REPO_ROOT, check=True,
                                 capture_output=True).stdout for name in names}


def checkout_sources() -> dict[str, bytes]:
    """The kernel sources of this checkout, by file name."""
    folder = os.path.join(REPO_ROOT, CSRC)
    sources = {}
    for name in os.listdir(folder):
        with open(os.path.join(folder, name), "rb") as f:
            sources[name] = f.read()
    return sources


def build(sources: dict[str, bytes], source: str, defines: tuple[str, ...] = ()) -> ctypes.CDLL:
    """`source` of these sources compiled as the engine compiles its kernels (same compiler and flags, and
    -D`defines`) and loaded."""
    compiler = cpu_kernels.c_compiler()
    if compiler is None:
        raise RuntimeError("no C compiler ($CC, gcc or cc) to build the kernel with")
    folder = tempfile.mkdtemp(prefix="kernel-revision-")
    for name, text in sources.items():
        with open(os.path.join(folder, name), "wb") as f:
            f.write(text)
    library = os.path.join(folder, os.path.splitext(source)[0] + ".so")
    try:
        cpu_kernels.compile_library(compiler, os.path.join(folder, source), library, [f"-D{d}" for d in defines])
    except subprocess.CalledProcessError as error:
        raise RuntimeError(f"building {source} failed:\n{error.stderr.decode(errors='replace')}") from error
    return ctypes.CDLL(library)
