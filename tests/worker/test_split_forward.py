"""A step's tokens split over several forward passes give the same tokens and logprobs as one pass."""
from __future__ import annotations

import pytest

from pagedllm import LLM, SamplingParams
from pagedllm.core.request import Request
from pagedllm.worker.model_runner import _split


def _request(name: str) -> Request:
    return Request(name, [1, 2, 3], SamplingParams(), 0.0)


def test_split_keeps_order_and_fills_parts_up_to_the_limit():
    a, b, c, d = (_request(x) for x in "abcd")
    assert _split([(a, 5), (b, 3), (c, 9), (d, 1)], 8) == [[(a, 5), (b, 3)], [(c, 9)], [(d, 1)]]
    assert _split([(a, 5), (b, 3)], None) == [[(a, 5), (b, 3)]]


@pytest.mark.slow
def test_split_forward_passes_equal_one_pass(tiny_model_dir):
    llm = LLM(tiny_model_dir, num_gpu_blocks_override=64, enable_prefix_caching=False)
    prompts = [{"prompt_token_ids": list(range(10 + i, 30 + 3 * i))} for i in range(6)]
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=2, prompt_logprobs=1)
    runner = llm.llm_engine.model_executor.worker.model_runner
    runner.tokens_per_forward = None
    whole = llm.generate(prompts, params, use_tqdm=False)
    runner.tokens_per_forward = 25  # every prefill step now runs as several passes
    split = llm.generate(prompts, params, use_tqdm=False)
    for one, several in zip(whole, split):
        assert one.outputs[0].token_ids == several.outputs[0].token_ids
        assert one.outputs[0].cumulative_logprob == pytest.approx(several.outputs[0].cumulative_logprob, abs=1e-4)
        assert [list(p or {}) for p in one.prompt_logprobs] == [list(p or {}) for p in several.prompt_logprobs]
