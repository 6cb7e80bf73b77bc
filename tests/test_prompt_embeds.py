"""Prompt embeddings (enable_prompt_embeds=True): generating from the embeddings of a prompt's tokens equals
generating from the tokens, through chunked prefill and across the worker process boundary; such requests
skip the prefix cache (their blocks have no token ids to be found by)."""
from __future__ import annotations

import pytest
import torch

from pagedllm import LLM, SamplingParams

pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "Write a short poem about the sea, the wind and the gulls that fly over "
           "the harbour at dawn, when the fishing boats go out"]
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def _looked_up(llm: LLM, ids: list[int]) -> torch.Tensor:
    """The model's own embeddings of these tokens, as a user gets them from its embedding layer."""
    return llm.apply_model(lambda model: model.embed(torch.tensor(ids)).clone())[0]


def _from_ids_and_embeds(llm: LLM) -> tuple[list, list]:
    ids = [llm.get_tokenizer().encode(p) for p in PROMPTS]
    from_ids = llm.generate([{"prompt_token_ids": i} for i in ids], GREEDY, use_tqdm=False)
    from_embeds = llm.generate([{"prompt_embeds": _looked_up(llm, i)} for i in ids], GREEDY, use_tqdm=False)
    return from_ids, from_embeds


@pytest.fixture(scope="module")
def embeds_llm():
    # A token budget below the long prompt's length: it is prefilled in chunks, the embeddings with it.
    llm = LLM(enable_prompt_embeds=True, enable_chunked_prefill=True, max_num_batched_tokens=16, max_num_seqs=4,
              num_gpu_blocks_override=64)
    yield llm
    llm.llm_engine.model_executor.shutdown()


def test_embeddings_generate_what_their_tokens_generate(embeds_llm):
    from_ids, from_embeds = _from_ids_and_embeds(embeds_llm)
    assert [o.outputs[0].token_ids for o in from_embeds] == [o.outputs[0].token_ids for o in from_ids]
    assert all(len(o.outputs[0].token_ids) == 12 for o in from_embeds)
    assert [o.outputs[0].text for o in from_embeds] == [o.outputs[0].text for o in from_ids]


def test_embeddings_requests_skip_the_prefix_cache(embeds_llm):
    ids = embeds_llm.get_tokenizer().encode(PROMPTS[1])
    embeds = _looked_up(embeds_llm, ids)
    embeds_llm.generate([{"prompt_embeds": embeds}], GREEDY, use_tqdm=False)
    again = embeds_llm.generate([{"prompt_embeds": embeds}], GREEDY, use_tqdm=False)[0]
    assert again.num_cached_tokens == 0


def test_embeddings_are_refused_without_the_flag_or_in_the_wrong_shape(llm, embeds_llm):
    with pytest.raises(ValueError, match="enable_prompt_embeds"):
        llm.generate([{"prompt_embeds": torch.zeros(3, 576)}], GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="shape"):
        embeds_llm.generate([{"prompt_embeds": torch.zeros(3, 7)}], GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="prompt_logprobs"):
        embeds_llm.generate([{"prompt_embeds": torch.zeros(3, 576)}],
                            SamplingParams(max_tokens=2, prompt_logprobs=1), use_tqdm=False)


def test_embeddings_cross_to_a_worker_process(tiny_model_dir):
    llm = LLM(tiny_model_dir, enable_prompt_embeds=True, distributed_executor_backend="mp",
              num_gpu_blocks_override=32)
    try:
        from_ids, from_embeds = _from_ids_and_embeds(llm)
        assert [o.outputs[0].token_ids for o in from_embeds] == [o.outputs[0].token_ids for o in from_ids]
    finally:
        llm.llm_engine.model_executor.shutdown()
