"""A separate draft model, and speculative decoding under the mp executor with tensor parallelism (the draft
lives on the rank that samples), on the tiny model and on the default model: greedy outputs equal plain
decoding's."""
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


@pytest.mark.slow
def test_tensor_parallel_3_on_the_default_model_equals_one_worker(llm):
    """tensor_parallel_size=3 under mp with prompt lookup: the greedy tokens and top logprobs of one in-process
    worker without speculation, up to near ties (a sharded model sums in another order)."""
    from tests.executor.test_parallel import _assert_equal_up_to_near_ties

    prompts = ["Count: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,",
               "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. The quick"]
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True, logprobs=2)
    expected = llm.generate(prompts, params, use_tqdm=False)
    sharded = LLM(tensor_parallel_size=3, distributed_executor_backend="mp", num_gpu_blocks_override=64,
                  speculative_config={"method": "ngram", "num_speculative_tokens": 4})
    try:
        outputs = sharded.generate(prompts, params, use_tqdm=False)
    finally:
        sharded.llm_engine.model_executor.shutdown()
    _assert_equal_up_to_near_ties(outputs, expected)
    assert all(o.metrics.spec_token_acceptance_counts[1] > 0 for o in outputs)  # proposals were kept
