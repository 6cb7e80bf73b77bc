"""Host values as device tensors, without waiting for the device."""
from __future__ import annotations

from typing import Any

import torch


def device_tensor(data: Any, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """`data` (a list, nested lists or a CPU tensor) as a tensor of `dtype` on `device`.

    `torch.tensor(data, device=cuda)` is a blocking copy: it waits until the device has finished all work queued
    before it, so building a step's sampling parameters after launching its forward pass would wait for the
    whole pass. A non-blocking copy is staged by the driver at once and runs on the stream after that work."""
    if isinstance(data, torch.Tensor):
        tensor = data if data.dtype == dtype else data.to(dtype)
    else:
        tensor = torch.tensor(data, dtype=dtype)
    return tensor if torch.device(device).type == "cpu" else tensor.to(device, non_blocking=True)
