"""Seeded random mixes of sampling parameters in one batch under prompt lookup, on the tiny model, with prefills
chunked so that requests sample their first tokens while others verify proposals. Greedy requests end exactly as
in plain decoding (tokens, logprobs, finish and stop reasons, a failure at the same token included); sampled ones
end normally or fail only where their own parameters leave no token to sample; the engine ends empty."""
from __future__ import annotations

import random

import pytest

from pagedllm import LLM, SamplingParams
from pagedllm.sampling_params import GuidedDecodingParams

pytestmark = pytest.mark.slow

NUM_REQUESTS = 32
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


def _prompt(r: random.Random) -> dict:
    """Token ids that repeat a short pattern, so that prompt lookup proposes from the start."""
    pattern = [r.randrange(200, 2000) for _ in range(r.randint(2, 5))]
    return {"prompt_token_ids": (pattern * 20)[:r.randint(6, 60)]}


def _params(r: random.Random, eos: int) -> SamplingParams:
    greedy = r.random() < 0.6
    kwargs = dict(max_tokens=r.choice([1, 4, 12, 24]), temperature=0.0 if greedy else r.choice([0.5, 1.0]),
                  seed=r.randrange(2 ** 31), ignore_eos=r.random() < 0.3)
    maybe = lambda probability: r.random() < probability  # noqa: E731
    if maybe(0.3):
        kwargs["logprobs"] = r.randint(0, 3)
    if maybe(0.2):
        kwargs["prompt_logprobs"] = r.randint(0, 2)
    if maybe(0.3):
        kwargs["presence_penalty"] = r.choice([-1.0, 1.0])
    if maybe(0.3):
        kwargs["frequency_penalty"] = r.choice([-1.0, 1.0])
    if maybe(0.3):
        kwargs["repetition_penalty"] = r.choice([0.8, 1.3])
    if not greedy and maybe(0.5):
        kwargs.update(top_k=r.choice([1, 5, 50]), top_p=r.choice([0.5, 0.9]), min_p=r.choice([0.0, 0.1]))
    if maybe(0.25):  # with EOS or without it: min_tokens may then leave no token to sample
        kwargs["allowed_token_ids"] = r.sample(range(200, 2000), r.randint(1, 6)) + ([eos] if maybe(0.5) else [])
    if maybe(0.25):
        kwargs["logit_bias"] = {token: r.choice([-100.0, 5.0]) for token in r.sample(range(200, 2000), 3)}
    if maybe(0.2):
        kwargs["stop_token_ids"] = r.sample(range(200, 2000), 2)
    if maybe(0.3):
        kwargs["min_tokens"] = r.randint(0, kwargs["max_tokens"])
    if maybe(0.15):
        kwargs["guided_decoding"] = GuidedDecodingParams(regex=r.choice(["[0-9]{1,4}", "(ab|cd)+", "x"]))
    return SamplingParams(**kwargs)


def _end(output) -> tuple:
    completion = output.outputs[0]
    logprobs = [[(token, round(entry.logprob, 3)) for token, entry in position.items()]
                for position in completion.logprobs or []]
    return completion.token_ids, completion.finish_reason, completion.stop_reason, logprobs


def test_random_parameter_mixes_end_as_in_plain_decoding(tiny_model_dir, tokenizer):
    r = random.Random(7)
    prompts = [_prompt(r) for _ in range(NUM_REQUESTS)]
    params = [_params(r, tokenizer.eos_token_id) for _ in range(NUM_REQUESTS)]
    settings = dict(max_model_len=128, enable_chunked_prefill=True, max_num_batched_tokens=48, max_num_seqs=16)
    spec_llm = LLM(tiny_model_dir, speculative_config=NGRAM, **settings)
    spec = spec_llm.generate(prompts, params, use_tqdm=False)
    plain = LLM(tiny_model_dir, **settings).generate(prompts, params, use_tqdm=False)
    greedy = [i for i, p in enumerate(params) if p.temperature == 0]
    for i in greedy:
        got, want = _end(spec[i]), _end(plain[i])
        assert got[:3] == want[:3], params[i]
        for a, b in zip(got[3], want[3], strict=True):
            assert [t for t, _ in a] == [t for t, _ in b]
            assert all(abs(x - y) <= 2e-3 for (_, x), (_, y) in zip(a, b))
    for output in spec:
        completion = output.outputs[0]
        assert completion.finish_reason in ("stop", "length") or (
            completion.finish_reason == "error" and "leave no token to sample" in completion.stop_reason)
    counts = [o.metrics.spec_token_acceptance_counts for o in spec]
    assert sum(c[1] for c in counts if c is not None) > 0  # proposals were verified and kept
    engine = spec_llm.llm_engine
    assert not engine.has_unfinished_requests()
    assert all(s.kv_cache.num_free_blocks == s.kv_cache.num_blocks for s in engine.schedulers)
