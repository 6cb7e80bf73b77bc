"""Which task a model runs, and how its hidden states become one output per request (the pooler).

The pooler settings come, in order of precedence, from `override_pooler_config`, a sentence-transformers
folder's own files (modules.json, 1_Pooling/config.json, sentence_bert_config.json) and the task's defaults.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields, replace
from typing import Any, Optional, Union

TASKS = ("auto", "generate", "embed", "classify", "score", "reward")
POOLING_TASKS = ("embed", "classify", "score", "reward")
POOLING_TYPES = ("LAST", "CLS", "MEAN", "ALL", "STEP")
_TASK_ALIASES = {"embedding": "embed"}  # vLLM's older name
_ENCODER_ARCHITECTURES = {"BertModel", "BertForSequenceClassification"}
# sentence-transformers pooling modes pagedllm implements, by their config key.
_ST_MODES = {"pooling_mode_cls_token": "CLS", "pooling_mode_mean_tokens": "MEAN", "pooling_mode_lasttoken": "LAST"}
_ST_MODULES = {"sentence_transformers.models.Transformer", "sentence_transformers.models.Pooling",
               "sentence_transformers.models.Normalize"}


@dataclass(frozen=True)
class PoolerConfig:
    """How a pooling model's hidden states become its outputs. `pooling_type`: one of POOLING_TYPES;
    `normalize`: L2-normalize each output; `softmax`: softmax over each output's last axis; `step_tag_id`:
    for STEP pooling, the token whose positions are kept (None: every position)."""

    pooling_type: Optional[str] = None
    normalize: Optional[bool] = None
    softmax: Optional[bool] = None
    step_tag_id: Optional[int] = None

    def __post_init__(self) -> None:
        if self.pooling_type is not None and self.pooling_type not in POOLING_TYPES:
            raise ValueError(f"pooling_type must be one of {', '.join(POOLING_TYPES)}, got {self.pooling_type!r}.")
        if self.step_tag_id is not None and self.pooling_type != "STEP":
            raise ValueError("step_tag_id is only read by pooling_type='STEP'.")

    @classmethod
    def from_override(cls, override: Union[None, dict, "PoolerConfig"]) -> "PoolerConfig":
        if override is None or isinstance(override, PoolerConfig):
            return override or cls()
        if not isinstance(override, dict):
            raise ValueError(f"override_pooler_config must be a dict or PoolerConfig, got {override!r}.")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(override) - known)
        if unknown:
            raise ValueError(f"override_pooler_config: unsupported keys {unknown}; supported: {sorted(known)}.")
        return cls(**override)

    def over(self, base: "PoolerConfig") -> "PoolerConfig":
        """These settings where they are set, `base`'s elsewhere."""
        given = {f.name: getattr(self, f.name) for f in fields(self)}
        return replace(base, **{name: value for name, value in given.items() if value is not None})


def model_tasks(hf_config: Any) -> tuple[str, ...]:
    """The tasks a model can run, the one `task="auto"` picks first. A `*ForSequenceClassification` head
    classifies, and with one label it is a cross-encoder that scores a text pair in one pass."""
    if has_classifier(hf_config):
        return ("classify", "score") if hf_config.num_labels == 1 else ("classify",)
    if is_encoder(hf_config):
        return ("embed",)
    return ("generate", "embed", "reward")


def has_classifier(hf_config: Any) -> bool:
    """A `*ForSequenceClassification` architecture: its pooled row goes through a classification head."""
    return any(a.endswith("ForSequenceClassification") for a in getattr(hf_config, "architectures", None) or [])


def check_task_name(task: str) -> None:
    if _TASK_ALIASES.get(task, task) not in TASKS:
        raise ValueError(f"task {task!r} is not a valid task; valid tasks are: {', '.join(TASKS)}.")


def resolve_task(task: str, hf_config: Any) -> str:
    """The task the engine runs: `task` checked against the valid names and against the model."""
    check_task_name(task)
    task = _TASK_ALIASES.get(task, task)
    supported = model_tasks(hf_config)
    if task == "auto":
        return supported[0]
    if task not in supported:
        archs = getattr(hf_config, "architectures", None)
        raise ValueError(f"task={task!r} is not supported by this model ({archs}); it supports: "
                         f"{', '.join(supported)}.")
    return task


def is_encoder(hf_config: Any) -> bool:
    """A bidirectional encoder (BERT), which keeps no KV cache."""
    archs = set(getattr(hf_config, "architectures", None) or [])
    return bool(archs & _ENCODER_ARCHITECTURES)


def default_pooler_config(task: str, hf_config: Any, folder: Optional[str]) -> PoolerConfig:
    """The pooler a model runs `task` with, before any override."""
    first = "CLS" if is_encoder(hf_config) else "LAST"
    if task == "embed":
        base = PoolerConfig(first, normalize=True, softmax=False)
        st = sentence_transformers_pooler(folder) if folder else None
        return st.over(base) if st is not None else base
    if task in ("classify", "score"):
        return PoolerConfig(first, normalize=False, softmax=True)
    return PoolerConfig("ALL", normalize=False, softmax=False)


def sentence_transformers_pooler(folder: str) -> Optional[PoolerConfig]:
    """The pooling of a sentence-transformers folder (None if it is not one); modules pagedllm does not
    implement are refused rather than skipped."""
    modules_file = os.path.join(folder, "modules.json")
    if not os.path.isfile(modules_file):
        return None
    with open(modules_file) as f:
        modules = json.load(f)
    unknown = [m["type"] for m in modules if m["type"] not in _ST_MODULES]
    if unknown:
        raise ValueError(f"sentence-transformers modules {unknown} in {folder} are not supported; supported: "
                         f"{sorted(_ST_MODULES)}.")
    normalize = any(m["type"].endswith(".Normalize") for m in modules)
    pooling = next((m for m in modules if m["type"].endswith(".Pooling")), None)
    if pooling is None:
        return PoolerConfig(normalize=normalize)
    with open(os.path.join(folder, pooling["path"], "config.json")) as f:
        settings = json.load(f)
    modes = [key for key, value in settings.items() if key.startswith("pooling_mode") and value is True]
    if len(modes) != 1 or modes[0] not in _ST_MODES:
        raise ValueError(f"sentence-transformers pooling {modes} in {folder} is not supported; supported: one of "
                         f"{sorted(_ST_MODES)}.")
    return PoolerConfig(_ST_MODES[modes[0]], normalize=normalize)


def sentence_transformers_max_length(folder: str) -> Optional[int]:
    """`max_seq_length` of a sentence-transformers folder's sentence_bert_config.json, if it has one; its
    `do_lower_case` is refused, since the tokenizer would not apply it."""
    file = os.path.join(folder, "sentence_bert_config.json")
    if not os.path.isfile(file):
        return None
    with open(file) as f:
        settings = json.load(f)
    if settings.get("do_lower_case"):
        raise ValueError(f"do_lower_case=true in {file} is not supported.")
    return settings.get("max_seq_length")
