"""A disk cache of what a GGUF file costs seconds to produce at every start: its parsed config and its
weights dequantized to float32, kept as config.json and model.safetensors under ~/.cache/pagedllm/gguf,
keyed by the file's path, size and modification time (so an edited file is read afresh)."""
from __future__ import annotations

import json
import logging
import os
import tempfile
from typing import Any, Optional

import torch

from pagedllm.tokenizer import _CACHE_DIR, _file_key

logger = logging.getLogger(__name__)
_CONFIG = "config.json"
_WEIGHTS = "model.safetensors"


def _folder(path: str) -> str:
    return os.path.join(_CACHE_DIR, "gguf", _file_key(path))


def load_config(path: str) -> Optional[Any]:
    from transformers import LlamaConfig

    file = os.path.join(_folder(path), _CONFIG)
    if not os.path.isfile(file):
        return None
    with open(file) as f:
        return LlamaConfig.from_dict(json.load(f))


def save_config(path: str, config: Any) -> None:
    _write_atomically(os.path.join(_folder(path), _CONFIG),
                      lambda tmp: _write_text(tmp, json.dumps(config.to_dict(), indent=1)))


def load_weights(path: str) -> Optional[dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    file = os.path.join(_folder(path), _WEIGHTS)
    return load_file(file) if os.path.isfile(file) else None


def save_weights(path: str, tensors: dict[str, torch.Tensor]) -> None:
    from safetensors.torch import save_file

    _write_atomically(os.path.join(_folder(path), _WEIGHTS), lambda tmp: save_file(tensors, tmp))


def _write_text(file: str, text: str) -> None:
    with open(file, "w") as f:
        f.write(text)


def _write_atomically(target: str, write: Any) -> None:
    """Write to a temporary file and rename it, so a concurrent reader never sees half a file; a cache that
    cannot be written only costs the next start its time."""
    try:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(target), suffix=".tmp")
        os.close(fd)
        try:
            write(tmp)
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except OSError as error:
        logger.info("Could not cache %s: %s", target, error)
