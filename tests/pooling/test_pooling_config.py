"""PoolingParams, tasks and pooler settings, without a model."""
from __future__ import annotations

import json

import pytest
from transformers import BertConfig, LlamaConfig

from pagedllm import PoolingParams
from pagedllm.pooling.config import (PoolerConfig, default_pooler_config, resolve_task,
                                     sentence_transformers_pooler)


@pytest.mark.parametrize("kwargs, field", [
    ({"dimensions": 0}, "dimensions"), ({"normalize": "yes"}, "normalize"), ({"softmax": 1}, "softmax"),
    ({"truncate_prompt_tokens": 0}, "truncate_prompt_tokens"), ({"task": "generate"}, "pooling task"),
])
def test_invalid_pooling_params_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        PoolingParams(**kwargs)


def test_params_of_another_task_are_refused():
    with pytest.raises(ValueError, match="does not support normalize"):
        PoolingParams(normalize=True).verify("classify")
    with pytest.raises(ValueError, match="does not support activation"):
        PoolingParams(activation=False).verify("embed")
    with pytest.raises(ValueError, match="at most the model's embedding size"):
        PoolingParams(dimensions=1000).verify("embed", hidden_size=384)
    PoolingParams(dimensions=32, normalize=False).verify("embed", hidden_size=384)


def test_tasks_resolve_from_the_architecture():
    assert resolve_task("auto", BertConfig(architectures=["BertModel"])) == "embed"
    assert resolve_task("auto", LlamaConfig(architectures=["LlamaForCausalLM"])) == "generate"
    assert resolve_task("embedding", LlamaConfig()) == "embed"
    with pytest.raises(ValueError, match="valid tasks are: auto, generate, embed, classify, score, reward"):
        resolve_task("summarize", LlamaConfig())
    with pytest.raises(ValueError, match="it supports: embed"):
        resolve_task("generate", BertConfig(architectures=["BertModel"]))
    classifier = BertConfig(architectures=["BertForSequenceClassification"], num_labels=3)
    cross_encoder = LlamaConfig(architectures=["LlamaForSequenceClassification"], num_labels=1)
    assert resolve_task("auto", classifier) == "classify"
    assert resolve_task("auto", cross_encoder) == "classify"
    assert resolve_task("score", cross_encoder) == "score"
    with pytest.raises(ValueError, match=r"it supports: classify\.$"):
        resolve_task("score", classifier)


def test_override_pooler_config_is_checked_and_wins():
    base = default_pooler_config("embed", LlamaConfig(), None)
    assert (base.pooling_type, base.normalize) == ("LAST", True)
    merged = PoolerConfig.from_override({"pooling_type": "MEAN", "normalize": False}).over(base)
    assert (merged.pooling_type, merged.normalize) == ("MEAN", False)
    with pytest.raises(ValueError, match="pooling_type must be one of LAST, CLS, MEAN, ALL, STEP"):
        PoolerConfig.from_override({"pooling_type": "MAX"})
    with pytest.raises(ValueError, match="unsupported keys"):
        PoolerConfig.from_override({"pooling": "MEAN"})


def _st_folder(tmp_path, modules, pooling):
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return str(tmp_path)


def test_sentence_transformers_folders_are_read_as_they_are(tmp_path):
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    folder = _st_folder(tmp_path, modules, {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False})
    assert sentence_transformers_pooler(folder) == PoolerConfig("CLS", normalize=False)


def test_unsupported_sentence_transformers_modules_are_refused(tmp_path):
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}]
    folder = _st_folder(tmp_path, modules, {"pooling_mode_mean_tokens": True})
    with pytest.raises(ValueError, match="Dense"):
        sentence_transformers_pooler(folder)
    (tmp_path / "max").mkdir()
    folder = _st_folder(tmp_path / "max", modules[:2], {"pooling_mode_max_tokens": True})
    with pytest.raises(ValueError, match="pooling_mode_max_tokens"):
        sentence_transformers_pooler(folder)
