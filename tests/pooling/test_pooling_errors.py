"""Bad pooling requests and settings are clear errors, and the engine keeps serving."""
from __future__ import annotations

import pytest

from pagedllm import EngineArgs, PoolingParams, SamplingParams


def test_empty_and_too_long_prompts_are_refused(embed_llm):
    with pytest.raises(ValueError, match="The prompt cannot be empty"):
        embed_llm.embed({"prompt_token_ids": []}, use_tqdm=False)
    with pytest.raises(ValueError, match=r"length 300\) is longer than the maximum model length of 256.*chunking "
                                         "is not allowed for an encoder"):
        embed_llm.embed({"prompt_token_ids": [1000] * 300}, use_tqdm=False)
    truncated = embed_llm.embed({"prompt_token_ids": [1000] * 300}, truncate_prompt_tokens=100, use_tqdm=False)
    assert len(truncated[0].prompt_token_ids) == 100
    assert len(embed_llm.embed("still serving", use_tqdm=False)[0].outputs.embedding) == 384


def test_wrong_task_for_the_model(embed_llm, llm):
    with pytest.raises(ValueError, match="takes PoolingParams"):
        embed_llm.generate("Hello", SamplingParams(max_tokens=2), use_tqdm=False)
    with pytest.raises(ValueError, match="cannot serve 'classify' requests"):
        embed_llm.classify("Hello", use_tqdm=False)
    with pytest.raises(ValueError, match="does not support activation"):
        embed_llm.embed("Hello", pooling_params=PoolingParams(activation=True), use_tqdm=False)
    with pytest.raises(ValueError, match="runs task='generate' and takes SamplingParams"):
        llm.embed("Hello", use_tqdm=False)
    with pytest.raises(ValueError, match="LLM.score needs an embedding model"):
        llm.score("a", "b", use_tqdm=False)


@pytest.mark.parametrize("kwargs, message", [
    ({"task": "bogus"}, "valid tasks are: auto, generate, embed, classify, score, reward"),
    ({"task": "classify"}, "it supports: generate, embed, reward"),
    ({"task": "embed", "enable_chunked_prefill": True}, "chunking is not allowed for an encoder"),
    ({"task": "embed", "enable_prefix_caching": True}, "enable_prefix_caching"),
    ({"task": "embed", "override_pooler_config": {"pooling_type": "SUM"}}, "pooling_type"),
    ({"override_pooler_config": {"pooling_type": "MEAN"}}, "only read by pooling tasks"),
])
def test_invalid_pooling_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EngineArgs(**kwargs).create_engine_config()
