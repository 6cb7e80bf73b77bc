"""On a GPU: our bfloat16 greedy tokens against transformers' float32 reference on the same weights, up to
near ties (the same check as test_model_vs_hf.py's bfloat16 test, on every prompt). Skipped without CUDA."""
from __future__ import annotations

import pytest
import torch

from pagedllm import SamplingParams
from test_model_vs_hf import BF16_TIE_MARGIN, NUM_TOKENS, PROMPTS, _check_greedy, _reference_logprobs

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(scope="module")
def gpu_outputs(default_model):
    from pagedllm import LLM

    llm = LLM(default_model, device="cuda", num_gpu_blocks_override=2048)
    assert llm.llm_engine.model_config.dtype == torch.bfloat16
    ids = [llm.get_tokenizer().encode(p) for p in PROMPTS]
    params = SamplingParams(temperature=0, max_tokens=NUM_TOKENS, ignore_eos=True, logprobs=1)
    return ids, llm.generate([{"prompt_token_ids": i} for i in ids], params, use_tqdm=False)


@pytest.mark.parametrize("index", range(len(PROMPTS)))
def test_bfloat16_greedy_tokens_equal_transformers_up_to_near_ties(index, gpu_outputs, hf_model):
    ids, outputs = gpu_outputs
    got = list(outputs[index].outputs[0].token_ids)
    assert len(got) == NUM_TOKENS
    _check_greedy(index, got, _reference_logprobs(hf_model, ids[index], got)[len(ids[index]) - 1:], BF16_TIE_MARGIN)
