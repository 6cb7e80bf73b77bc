"""Sleep mode's weights: released from memory while the engine sleeps, restored in place on waking.

Level 1 keeps a host copy to restore from: on CPU the weights already live in host memory, so "moving them to
the host" would free nothing; instead every tensor of the model is written to a temporary file and its memory
released, so resident memory really drops, and waking reads them back into the same tensor objects (tied
weights and every module's reference stay valid). Level 2 keeps no copy; the worker reloads the model from its
files on waking. Either way the tensors' memory moves, so CPU graphs, which hold pointers, are rebuilt.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import tempfile

import torch
from torch import nn


def model_tensors(model: nn.Module) -> list[torch.Tensor]:
    """Every distinct strided tensor the model's modules hold: parameters, buffers and plain attributes (the
    packed weights of linear layers are the latter)."""
    seen: dict[int, torch.Tensor] = {}
    for module in model.modules():
        values = [*module._parameters.values(), *module._buffers.values(), *vars(module).values()]
        for value in values:
            if isinstance(value, torch.Tensor) and value.layout == torch.strided and value.numel() > 0:
                seen.setdefault(id(value), value)
    return list(seen.values())


class OffloadedWeights:
    """A model's tensors saved to a temporary file, their memory released until `restore()`."""

    def __init__(self, model: nn.Module) -> None:
        self.tensors = model_tensors(model)
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in self.tensors}
        self.nbytes = sum(storages.values())
        handle, self.path = tempfile.mkstemp(prefix="pagedllm-sleep-", suffix=".pt")
        os.close(handle)
        # One save keeps tensors that share a storage sharing it once loaded.
        torch.save([t.detach() for t in self.tensors], self.path)
        with torch.no_grad():
            for tensor in self.tensors:
                tensor.data = torch.empty(0, dtype=tensor.dtype, device=tensor.device)
        release_free_memory()

    def restore(self) -> None:
        """Put every tensor's saved values back (in newly allocated memory) and delete the file."""
        saved = torch.load(self.path, weights_only=True)
        with torch.no_grad():
            for tensor, values in zip(self.tensors, saved):
                tensor.data = values.to(tensor.device)
        self.discard()

    def discard(self) -> None:
        if os.path.exists(self.path):
            os.remove(self.path)


def release_free_memory() -> None:
    """Hand memory freed by Python and PyTorch back to the system. glibc keeps freed blocks of its heap for
    later allocations (only blocks above its mmap threshold, which grows as large blocks are freed, go back
    at once), so without a trim most of the weights would stay resident."""
    gc.collect()
    name = ctypes.util.find_library("c")
    if name is None:
        return
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None)
    if trim is not None:  # glibc only
        trim(0)
