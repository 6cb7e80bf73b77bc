"""Speculative decoding on the default model: greedy outputs (tokens and top logprobs) equal plain decoding's
for prompt lookup and the int8 self-draft, with prefix caching, under preemption, with stops in the middle of
an accepted run; sampled requests stay reproducible; guided requests stay inside their grammar."""
from __future__ import annotations

import pytest

from pagedllm import LLM, SamplingParams
from pagedllm.sampling_params import GuidedDecodingParams

pytestmark = pytest.mark.slow

PROMPTS = [
    "Repeat the following text exactly, without changes:\n\nThe meeting is moved to Thursday at ten. Please "
    "bring the quarterly report and the list of open tickets.",
    "Repeat the following list exactly:\n\n1. Open the door.\n2. Turn on the light.\n3. Close the window.\n",
]
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1}
INT8 = {"method": "draft_model", "quantization": "int8", "num_speculative_tokens": 3}


def chat(llm: LLM, params: SamplingParams, prompts: list[str] = PROMPTS):
    return llm.chat([[{"role": "user", "content": p}] for p in prompts], params, use_tqdm=False)


def assert_same_as_plain(spec_outputs, plain_outputs) -> None:
    for spec, plain in zip(spec_outputs, plain_outputs):
        a, b = spec.outputs[0], plain.outputs[0]
        assert a.token_ids == b.token_ids and a.text == b.text and a.finish_reason == b.finish_reason
        if b.logprobs is not None:
            for got, want in zip(a.logprobs, b.logprobs):
                assert list(got) == list(want)  # same top tokens, in the same order
                assert all(abs(got[t].logprob - want[t].logprob) < 1e-3 for t in want)


@pytest.fixture(scope="module")
def ngram_llm():
    return LLM(speculative_config=NGRAM)


@pytest.fixture(scope="module")
def greedy_plain(llm):
    return chat(llm, SamplingParams(max_tokens=40, temperature=0, logprobs=3))


@pytest.mark.parametrize("config", [NGRAM, INT8], ids=["ngram", "int8-self-draft"])
def test_greedy_outputs_equal_plain_decoding(request, config, greedy_plain):
    spec_llm = request.getfixturevalue("ngram_llm") if config is NGRAM else LLM(speculative_config=config)
    outputs = chat(spec_llm, SamplingParams(max_tokens=40, temperature=0, logprobs=3))
    assert_same_as_plain(outputs, greedy_plain)
    counts = [o.metrics.spec_token_acceptance_counts for o in outputs]
    assert all(c is not None and c[1] > 0 for c in counts)  # proposals were verified and some kept
    # A second round finds the prompts in the prefix cache and still decodes the same.
    again = chat(spec_llm, SamplingParams(max_tokens=40, temperature=0, logprobs=3))
    assert all(o.num_cached_tokens > 0 for o in again)
    assert_same_as_plain(again, greedy_plain)


def test_stops_inside_an_accepted_run_cut_there(ngram_llm, llm, greedy_plain):
    text = greedy_plain[0].outputs[0].text
    stop = text[len(text) // 2:len(text) // 2 + 3]
    for params in (SamplingParams(max_tokens=40, temperature=0, stop=[stop]),
                   SamplingParams(max_tokens=13, temperature=0, logprobs=1),
                   SamplingParams(max_tokens=40, temperature=0, stop=[stop], include_stop_str_in_output=True)):
        assert_same_as_plain(chat(ngram_llm, params), chat(llm, params))


def test_under_preemption_outputs_equal_plain_decoding(llm):
    spec_llm = LLM(speculative_config=NGRAM, num_gpu_blocks_override=12, block_size=16, max_num_seqs=4)
    prompts = PROMPTS * 2
    params = SamplingParams(max_tokens=60, temperature=0)
    outputs = chat(spec_llm, params, prompts)
    assert spec_llm.llm_engine.scheduler.num_preemptions > 0
    assert_same_as_plain(outputs, chat(llm, params, prompts))


def test_seeded_sampling_is_reproducible_with_n_samples(ngram_llm):
    params = SamplingParams(max_tokens=24, temperature=0.7, seed=11, n=2)
    first, second = chat(ngram_llm, params), chat(ngram_llm, params)
    assert [[c.token_ids for c in o.outputs] for o in first] == [[c.token_ids for c in o.outputs] for o in second]
    assert all(len(o.outputs) == 2 for o in first)


def test_guided_requests_stay_in_their_grammar(ngram_llm, llm):
    params = SamplingParams(max_tokens=20, temperature=0,
                            guided_decoding=GuidedDecodingParams(choice=["The meeting", "1. Open"]))
    outputs = chat(ngram_llm, params)
    assert all(o.outputs[0].text in ("The meeting", "1. Open") for o in outputs)
    assert_same_as_plain(outputs, chat(llm, params))
