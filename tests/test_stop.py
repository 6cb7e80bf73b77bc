"""Stop conditions: the stop-string helpers on their own, then each condition on the real default model."""
from __future__ import annotations

import pytest

from pagedllm import SamplingParams
from pagedllm.engine.stop_checker import find_stop_string, held_back_length

COUNTING = "1, 2, 3, 4,"  # greedy: " 5, 6, 7, 8, 9, 10, ..." one digit, comma or space per token
CHAT = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"  # a short answer, then EOS


def test_find_stop_string_only_matches_what_the_new_text_completes():
    assert find_stop_string("abc STOP", 2, ["STOP"], False) == ("STOP", 4)
    assert find_stop_string("abc STOP", 2, ["STOP"], True) == ("STOP", 8)
    # Entirely before the new text: already seen, not a new match.
    assert find_stop_string("STOP and more", 4, ["STOP"], False) is None
    assert find_stop_string("abc", 0, ["abc"], False) is None
    # The first listed stop string wins.
    assert find_stop_string("x ab", 2, ["b", "ab"], False) == ("b", 3)


def test_held_back_length_is_the_longest_stop_prefix_at_the_end():
    assert held_back_length("hello wor", ["world"]) == 3
    assert held_back_length("hello w", ["world", "wo"]) == 1
    assert held_back_length("hello", ["world"]) == 0
    assert held_back_length("abab", ["abac"]) == 2
    assert held_back_length("", ["x"]) == 0


def greedy(**kwargs) -> SamplingParams:
    kwargs.setdefault("max_tokens", 12)
    return SamplingParams(temperature=0, **kwargs)


def complete(llm, prompt: str, params: SamplingParams):
    return llm.generate(prompt, params, use_tqdm=False)[0].outputs[0]


@pytest.fixture(scope="module")
def counting(llm):
    return complete(llm, COUNTING, greedy())


@pytest.fixture(scope="module")
def chat(llm):
    return complete(llm, CHAT, greedy(max_tokens=32))


@pytest.mark.slow
def test_the_reference_completions(counting, chat, tokenizer):
    assert counting.text.startswith(" 5, 6, 7, 8")
    assert chat.finish_reason == "stop" and chat.stop_reason is None
    assert chat.token_ids[-1] == tokenizer.eos_token_id and len(chat.token_ids) < 32


@pytest.mark.slow
@pytest.mark.parametrize("include", [False, True])
def test_stop_string_across_token_boundaries(llm, counting, include):
    # "6, 7" spans four tokens: "6", ",", " ", "7".
    out = complete(llm, COUNTING, greedy(stop=["6, 7"], include_stop_str_in_output=include))
    assert out.finish_reason == "stop" and out.stop_reason == "6, 7"
    assert out.text == (" 5, 6, 7" if include else " 5, ")
    assert out.token_ids == counting.token_ids[:8]


@pytest.mark.slow
def test_stop_token_id_is_the_stop_reason(llm, counting, tokenizer):
    seven = counting.token_ids[7]
    assert tokenizer.decode([seven]) == "7"
    out = complete(llm, COUNTING, greedy(stop_token_ids=[seven]))
    assert out.finish_reason == "stop" and out.stop_reason == seven
    assert out.token_ids == counting.token_ids[:8]
    assert out.text == " 5, 6, "


@pytest.mark.slow
def test_max_tokens_caps_the_output(llm, counting):
    out = complete(llm, COUNTING, greedy(max_tokens=3))
    assert out.finish_reason == "length" and out.stop_reason is None
    assert out.token_ids == counting.token_ids[:3]


@pytest.mark.slow
@pytest.mark.parametrize("include", [False, True])
def test_eos_text_is_cut_even_when_special_tokens_are_shown(llm, chat, include):
    out = complete(llm, CHAT, greedy(max_tokens=32, skip_special_tokens=False, include_stop_str_in_output=include))
    assert out.token_ids == chat.token_ids and out.finish_reason == "stop" and out.stop_reason is None
    assert out.text == (chat.text + "<|im_end|>" if include else chat.text)


@pytest.mark.slow
def test_ignore_eos_keeps_going_past_eos(llm, chat, tokenizer):
    out = complete(llm, CHAT, greedy(max_tokens=len(chat.token_ids) + 5, ignore_eos=True))
    assert out.finish_reason == "length" and len(out.token_ids) == len(chat.token_ids) + 5
    assert out.token_ids[:len(chat.token_ids)] == chat.token_ids
    assert tokenizer.eos_token_id in out.token_ids


@pytest.mark.slow
def test_min_tokens_holds_off_eos_stop_ids_and_stop_strings(llm, chat, counting, tokenizer):
    n = len(chat.token_ids) + 4
    out = complete(llm, CHAT, greedy(max_tokens=n + 10, min_tokens=n))
    assert len(out.token_ids) >= n
    assert tokenizer.eos_token_id not in out.token_ids[:n]
    seven = counting.token_ids[7]
    out = complete(llm, COUNTING, greedy(stop_token_ids=[seven], min_tokens=10, max_tokens=10))
    assert seven not in out.token_ids and out.finish_reason == "length"
    out = complete(llm, COUNTING, greedy(stop=["6, 7"], min_tokens=10, max_tokens=10))
    assert "6, 7" in out.text and out.finish_reason == "length"
