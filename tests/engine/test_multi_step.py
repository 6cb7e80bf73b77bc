"""Multi-step decoding (num_scheduler_steps > 1) on the default model: outputs equal single-step decoding's
(greedy tokens and logprobs, stops, EOS and max_tokens inside a group, seeded n > 1 samples, preemption), each
token streams through LLMEngine.step() and AsyncLLMEngine (or each group once without
multi_step_stream_outputs), and vLLM's refusals."""
from __future__ import annotations

import asyncio

import pytest

from pagedllm import LLM, AsyncLLMEngine, EngineArgs, LLMEngine, SamplingParams
from pagedllm.sampling_params import GuidedDecodingParams, RequestOutputKind

pytestmark = pytest.mark.slow

PROMPTS = ["The three most important inventions of the twentieth century are", "Write a short poem about the sea."]
MAX_TOKENS = 24


def chat(llm: LLM, params: SamplingParams, prompts: list[str] = PROMPTS):
    return llm.chat([[{"role": "user", "content": p}] for p in prompts], params, use_tqdm=False)


def assert_same(got, want, num_tokens: int | None = None) -> None:
    """Equal outputs (the first `num_tokens` of `want`'s if given): tokens, text, finish, top logprobs."""
    for g, w in zip(got, want, strict=True):
        assert len(g.outputs) == len(w.outputs)
        for a, b in zip(g.outputs, w.outputs):
            if num_tokens is None:
                assert (a.text, a.finish_reason, a.stop_reason) == (b.text, b.finish_reason, b.stop_reason)
                assert a.cumulative_logprob is None or abs(a.cumulative_logprob - b.cumulative_logprob) < 1e-3
            assert a.token_ids == b.token_ids[:num_tokens]
            if b.logprobs is not None:
                for x, y in zip(a.logprobs, b.logprobs[:num_tokens], strict=True):
                    assert list(x) == list(y)  # the same top tokens, in the same order
                    assert all(abs(x[t].logprob - y[t].logprob) < 1e-4 and x[t].rank == y[t].rank for t in y)


@pytest.fixture(scope="module")
def multi_llm():
    """Groups of 4, each token streamed (multi_step_stream_outputs, the default)."""
    return LLM(num_scheduler_steps=4)


@pytest.fixture(scope="module")
def multi8_llm():
    return LLM(num_scheduler_steps=8)


@pytest.fixture(scope="module")
def grouped_engine():
    """Groups of 4, each group streamed once (multi_step_stream_outputs=False)."""
    return LLMEngine.from_engine_args(EngineArgs(num_scheduler_steps=4, multi_step_stream_outputs=False))


def streaming_engine(request, stream: bool) -> LLMEngine:
    """An engine of groups of 4 that streams each token (`stream`) or each group."""
    return request.getfixturevalue("multi_llm").llm_engine if stream else request.getfixturevalue("grouped_engine")


@pytest.fixture(scope="module")
def plain(llm):
    return chat(llm, SamplingParams(max_tokens=MAX_TOKENS, temperature=0, logprobs=3))


@pytest.mark.parametrize("steps", [4, 8])
def test_greedy_tokens_and_logprobs_equal_single_step(request, steps, plain):
    multi = request.getfixturevalue("multi_llm" if steps == 4 else "multi8_llm")
    # In one batch, max_tokens inside a group too (13 is no multiple of 4 or 8): the tokens and logprobs
    # single-step starts with.
    params = [SamplingParams(max_tokens=n, temperature=0, logprobs=3) for n in (MAX_TOKENS, 13) for _ in PROMPTS]
    outputs = chat(multi, params, PROMPTS * 2)
    assert_same(outputs[:len(PROMPTS)], plain)
    assert_same(outputs[len(PROMPTS):], plain, num_tokens=13)


def test_stop_strings_and_eos_inside_a_group(multi_llm, llm, plain):
    text = plain[1].outputs[0].text
    stop = text[len(text) // 2:len(text) // 2 + 3]
    # One batch: the stop string left out and kept, and a short answer that ends with EOS before max_tokens,
    # in the middle of a group.
    prompts = PROMPTS[1:] * 2 + ["Reply with one word: is water wet?"]
    params = [SamplingParams(max_tokens=MAX_TOKENS, temperature=0, stop=[stop], include_stop_str_in_output=include)
              for include in (False, True)] + [SamplingParams(max_tokens=40, temperature=0)]
    want = chat(llm, params, prompts)
    eos = want[-1].outputs[0]
    assert eos.finish_reason == "stop" and eos.stop_reason is None
    assert len(eos.token_ids) % 4 != 1  # not at a group's first token
    assert_same(chat(multi_llm, params, prompts), want)


def test_seeded_n_samples_equal_single_step(multi_llm, llm):
    params = SamplingParams(n=2, temperature=0.8, top_p=0.95, seed=7, max_tokens=16, logprobs=1,
                            frequency_penalty=0.3)
    got = chat(multi_llm, params, PROMPTS[1:])
    assert len({tuple(c.token_ids) for c in got[0].outputs}) > 1  # the samples differ
    assert_same(got, chat(llm, params, PROMPTS[1:]))


def test_under_preemption_outputs_equal_single_step(llm):
    small = LLM(num_scheduler_steps=4, num_gpu_blocks_override=9, block_size=16, max_num_seqs=3)
    prompts = PROMPTS + PROMPTS[:1]
    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    outputs = chat(small, params, prompts)
    assert small.llm_engine.scheduler.num_preemptions > 0
    assert_same(outputs, chat(llm, params, prompts))


def _step_outputs(engine: LLMEngine, params: SamplingParams) -> list[list]:
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(str(i), prompt, params)
    steps = []
    while engine.has_unfinished_requests():
        steps.append(engine.step())
    return steps


@pytest.mark.parametrize("stream", [True, False])
def test_engine_step_streams_each_token_or_each_group(request, stream, llm):
    engine = streaming_engine(request, stream)
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    steps = _step_outputs(engine, params)
    counts: dict[str, list[int]] = {}
    for outputs in steps:
        assert len({o.request_id for o in outputs}) == len(outputs)  # at most one output per request a step
        for output in outputs:
            counts.setdefault(output.request_id, []).append(len(output.outputs[0].token_ids))
    for request_id, seen in counts.items():
        # 1 from the prefill, then each token (stream) or each group of 4: 1, 5, 9; 10 ends a group of 1.
        assert seen == (list(range(1, 11)) if stream else [1, 5, 9, 10]), request_id
    finals = {o.request_id: o for outputs in steps for o in outputs if o.finished}
    want = llm.generate(PROMPTS, params, use_tqdm=False)
    assert [finals[str(i)].outputs[0].text for i in range(len(PROMPTS))] == [w.outputs[0].text for w in want]


def test_abort_inside_a_group_drops_its_streamed_tokens(multi8_llm):
    engine = multi8_llm.llm_engine
    engine.add_request("a", PROMPTS[0], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    engine.add_request("b", PROMPTS[1], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True))
    engine.step()  # the prefills
    assert {o.request_id for o in engine.step()} == {"a", "b"}  # a group's first token; seven more wait
    engine.abort_request("a")
    rest = []
    while engine.has_unfinished_requests():
        rest.extend(engine.step())
    assert rest and all(o.request_id == "b" for o in rest)


@pytest.mark.parametrize("stream", [True, False])
def test_async_engine_streams_deltas_that_add_up(request, stream, llm):
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, output_kind=RequestOutputKind.DELTA)
    loop = asyncio.new_event_loop()
    engine = AsyncLLMEngine(streaming_engine(request, stream))

    async def collect():
        return [o async for o in engine.generate(PROMPTS[0], params, "r")]

    try:
        outputs = loop.run_until_complete(collect())
    finally:
        engine.shutdown_background_loop()
        loop.close()
    want = llm.generate([PROMPTS[0]], SamplingParams(max_tokens=10, temperature=0, ignore_eos=True),
                        use_tqdm=False)[0].outputs[0]
    assert "".join(o.outputs[0].text for o in outputs) == want.text
    assert [t for o in outputs for t in o.outputs[0].token_ids] == want.token_ids
    assert [len(o.outputs[0].token_ids) for o in outputs] == ([1] * 10 if stream else [1, 4, 4, 1])


def test_guided_decoding_and_logits_processors_are_refused_per_request(multi_llm):
    engine = multi_llm.llm_engine
    for name, params in (("guided_decoding", SamplingParams(guided_decoding=GuidedDecodingParams(choice=["a"]))),
                         ("logits_processors", SamplingParams(logits_processors=[lambda ids, logits: logits]))):
        with pytest.raises(ValueError, match=f"not supported in multi-step decoding.*{name}"):
            engine.add_request("bad", "Hello", params)
    assert not engine.has_unfinished_requests()
    assert chat(multi_llm, SamplingParams(max_tokens=3, temperature=0))[0].outputs[0].token_ids  # others go on


def test_a_request_failing_inside_a_group_keeps_the_tokens_before_it(multi_llm, llm):
    """Parameters that leave no token to sample at the third token, the second of the first group (" the" or
    EOS allowed, EOS barred by min_tokens, a third " the" a bad word): the two tokens before it are kept, then
    the request fails, as in single-step decoding."""
    tokenizer = llm.get_tokenizer()
    the = tokenizer.encode(" the", add_special_tokens=False)[0]
    params = SamplingParams(max_tokens=10, temperature=0, allowed_token_ids=[the, tokenizer.eos_token_id],
                            min_tokens=5, bad_words=["the the the"])
    got, want = (m.generate(["Hello"], params, use_tqdm=False)[0].outputs[0] for m in (multi_llm, llm))
    assert got.token_ids == want.token_ids == [the, the]
    assert got.finish_reason == want.finish_reason == "error"
    assert got.stop_reason == want.stop_reason and "leave no token to sample" in got.stop_reason


@pytest.mark.parametrize("kwargs, match", [
    ({"num_scheduler_steps": 0}, "num_scheduler_steps"),
    ({"num_scheduler_steps": 4, "speculative_config": {"method": "ngram", "num_speculative_tokens": 2}},
     "Speculative decoding is not supported with multi-step"),
    ({"num_scheduler_steps": 4, "tensor_parallel_size": 3}, "num_scheduler_steps > 1 is not supported"),
])
def test_settings_multi_step_cannot_honour_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        EngineArgs(**kwargs).create_engine_config()


def test_serve_flags_set_multi_step():
    from pagedllm.entrypoints.cli import build_parser

    args = build_parser().parse_args(["serve", "--num-scheduler-steps", "8", "--no-multi-step-stream-outputs"])
    engine_args = EngineArgs.from_cli_args(args)
    assert (engine_args.num_scheduler_steps, engine_args.multi_step_stream_outputs) == (8, False)
