"""Tokenizer and generation defaults from the model's own files, never from a hub."""
from __future__ import annotations

import hashlib
import logging
import os
from typing import Any, Optional

from pagedllm.config import ModelConfig

logger = logging.getLogger(__name__)
_CACHE_DIR = os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "pagedllm")


def get_tokenizer(model_config: ModelConfig) -> Any:
    from transformers import AutoTokenizer

    path = model_config.tokenizer
    if not path.endswith(".gguf"):
        return AutoTokenizer.from_pretrained(path)
    # Building a tokenizer from GGUF metadata takes seconds; keep the converted files for the next start.
    cached = os.path.join(_CACHE_DIR, "tokenizers", _file_key(path))
    if os.path.isfile(os.path.join(cached, "tokenizer_config.json")):
        return AutoTokenizer.from_pretrained(cached)
    tokenizer = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    try:
        tokenizer.save_pretrained(cached)
    except OSError as error:
        logger.info("Could not cache the tokenizer in %s: %s", cached, error)
    return tokenizer


def _file_key(path: str) -> str:
    stat = os.stat(path)
    return hashlib.sha256(f"{os.path.abspath(path)}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]


def get_generation_config(model_config: ModelConfig) -> Optional[Any]:
    """The model folder's generation_config.json (or the folder given), unless generation_config='vllm'."""
    from transformers import GenerationConfig

    source = model_config.generation_config
    if source == "vllm":
        return None
    folder = model_config.path if source == "auto" else source
    if not os.path.isfile(os.path.join(folder, "generation_config.json")):
        return None
    return GenerationConfig.from_pretrained(folder)
