"""A separate draft model, and speculative decoding under the mp executor with tensor parallelism (the draft
lives on the rank that samples), on the tiny model: greedy outputs equal plain decoding's."""
from __future__ import annotations

import pytest

from pagedllm import LLM, SamplingParams

PROMPTS = [{"prompt_token_ids": [200, 201, 202, 203] * 5}, {"prompt_token_ids": [300, 301, 302] * 6 + [7]}]
PARAMS = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True, logprobs=2)


@pytest.fixture(scope="module")
def plain(tiny_model_dir):
    return [o.outputs[0] for o in LLM(tiny_model_dir).generate(PROMPTS, PARAMS, use_tqdm=False)]


def generate(llm: LLM):
    return [o.outputs[0] for o in llm.generate(PROMPTS, PARAMS, use_tqdm=False)]


def assert_same(outputs, plain) -> None:
    for got, want in zip(outputs, plain):
        assert got.token_ids == want.token_ids
        for a, b in zip(got.logprobs, want.logprobs):
            assert list(a) == list(b) and all(abs(a[t].logprob - b[t].logprob) < 1e-3 for t in b)


def test_a_separate_draft_model_that_always_agrees_is_always_accepted(tiny_model_dir, plain):
    # The model as its own float32 draft proposes exactly what it then verifies.
    llm = LLM(tiny_model_dir, speculative_config={"method": "draft_model", "model": tiny_model_dir,
                                                   "num_speculative_tokens": 3})
    outputs = llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    assert_same([o.outputs[0] for o in outputs], plain)
    for output in outputs:
        counts = output.metrics.spec_token_acceptance_counts
        assert counts[0] > 0 and counts[1] == counts[0]  # every verifying step kept its proposals


@pytest.mark.slow
@pytest.mark.parametrize("config", [{"method": "ngram", "num_speculative_tokens": 3},
                                    {"method": "draft_model", "quantization": "int8", "num_speculative_tokens": 2}],
                         ids=["ngram", "int8-self-draft"])
def test_tensor_parallel_under_mp_equals_plain(tiny_model_dir, plain, config):
    llm = LLM(tiny_model_dir, tensor_parallel_size=2, distributed_executor_backend="mp", speculative_config=config)
    assert_same(generate(llm), plain)
