"""Generated-token counts on the default model when a step samples several tokens per request (multi-step
groups, accepted speculative runs): only the tokens the requests keep count, as vLLM counts the tokens appended
to its sequences, so tokens sampled after a stop inside a group or run are not generated tokens."""
from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from pagedllm import LLM, SamplingParams

pytestmark = pytest.mark.slow

PROMPTS = ["The three most important inventions of the twentieth century are",
           "Count on: one two three four five one two three four five one two three four five one two"]


def _value(name: str, model_name: str) -> float:
    value = REGISTRY.get_sample_value(name, {"model_name": model_name})
    assert value is not None, f"{name} is not exported"
    return value


def _count_sampled(llm: LLM) -> list[int]:
    """Record every token the workers return (kept or not), by wrapping the output processor."""
    sampled = []
    processor = llm.llm_engine.output_processor
    process = processor.process

    def counting(states, result, *args, **kwargs):
        sampled.append(sum(len(tokens) for tokens in result.sampled_token_ids.values()))
        return process(states, result, *args, **kwargs)

    processor.process = counting
    return sampled


def _stop_inside(llm: LLM, prompt: str, sampled: list[int]) -> str:
    """A stop string that greedy decoding of `prompt` meets in the middle of its output."""
    text = llm.generate([prompt], SamplingParams(max_tokens=24, temperature=0), use_tqdm=False)[0].outputs[0].text
    sampled.clear()
    return text[len(text) // 2:len(text) // 2 + 3]


def _assert_counts_are_kept_tokens(llm: LLM, name: str, params: list[SamplingParams], sampled: list[int]) -> int:
    """The counters follow the tokens of the outputs, not the tokens sampled; the tokens after each request's
    first."""
    names = ("vllm:generation_tokens_total", "vllm:request_generation_tokens_sum", "vllm:tokens_total")
    before = [_value(metric, name) for metric in names]
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    kept = sum(len(o.outputs[0].token_ids) for o in outputs)
    assert {o.outputs[0].finish_reason for o in outputs} == {"stop", "length"}
    assert sum(sampled) > kept  # tokens after a stop were sampled and dropped
    added = [_value(metric, name) - value for metric, value in zip(names, before)]
    prompt_tokens = sum(len(o.prompt_token_ids) for o in outputs)
    assert added == [kept, kept, prompt_tokens + kept]
    return kept - len(outputs)


def test_multi_step_counts_the_tokens_before_a_stop():
    name = "multi-step-counts"
    llm = LLM(num_scheduler_steps=8, disable_log_stats=False, served_model_name=name)
    sampled = _count_sampled(llm)
    stop = _stop_inside(llm, PROMPTS[0], sampled)
    assert _value("vllm:generation_tokens_total", name) == 24
    # A stop string in the middle of a group of 8, and max_tokens (13) inside a group.
    params = [SamplingParams(max_tokens=24, temperature=0, stop=[stop]), SamplingParams(max_tokens=13, temperature=0)]
    tpot = _value("vllm:time_per_output_token_seconds_count", name)
    later_tokens = _assert_counts_are_kept_tokens(llm, name, params, sampled)
    # Each kept token of a group is one time per output token, as if vLLM had taken it in a step of its own.
    assert _value("vllm:time_per_output_token_seconds_count", name) - tpot == later_tokens


def test_speculative_decoding_counts_the_tokens_before_a_stop():
    name = "spec-decode-counts"
    llm = LLM(speculative_config={"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4},
              disable_log_stats=False, served_model_name=name)
    sampled = _count_sampled(llm)
    stop = _stop_inside(llm, PROMPTS[1], sampled)
    assert _value("vllm:spec_decode_num_accepted_tokens_total", name) > 0
    # The repeated count is proposed and accepted in runs: a stop string inside one, and max_tokens (11).
    params = [SamplingParams(max_tokens=11, temperature=0), SamplingParams(max_tokens=24, temperature=0, stop=[stop])]
    _assert_counts_are_kept_tokens(llm, name, params, sampled)
