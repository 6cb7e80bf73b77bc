"""Guided decoding on the real default model: every output matches its schema, regex, choice or grammar."""
from __future__ import annotations

import json
import re

import pytest

from pagedllm import SamplingParams
from pagedllm.sample.guided_decoding import GrammarManager, num_grammar_tokens
from pagedllm.sampling_params import GuidedDecodingParams

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "likes_the_sea": {"type": "boolean"},
        "colour": {"type": "string", "enum": ["red", "green", "blue"]},
    },
    "required": ["name", "age", "likes_the_sea", "colour"],
}


def _chat_prompt(llm, text):
    return {"prompt_token_ids": llm.get_tokenizer().apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True, return_dict=False)}


def _validate(value):
    assert isinstance(value, dict) and set(value) == set(SCHEMA["required"])
    assert isinstance(value["name"], str) and len(value["name"]) <= 12
    assert isinstance(value["age"], int) and not isinstance(value["age"], bool) and 0 <= value["age"] <= 120
    assert isinstance(value["likes_the_sea"], bool) and value["colour"] in ("red", "green", "blue")


def _generate_all(llm, prompt, guided, seeds, max_tokens):
    params = [SamplingParams(temperature=1.0, seed=seed, max_tokens=max_tokens, guided_decoding=guided)
              for seed in seeds]
    return [o.outputs[0] for o in llm.generate([prompt] * len(params), params, use_tqdm=False)]


@pytest.mark.slow
def test_json_schema_output_parses_and_validates_for_20_seeds(llm):
    guided = GuidedDecodingParams(json=SCHEMA, disable_any_whitespace=True)
    prompt = _chat_prompt(llm, "Describe a person as JSON.")
    for completion in _generate_all(llm, prompt, guided, range(20), 80):
        assert completion.finish_reason == "stop", completion.text
        _validate(json.loads(completion.text))


@pytest.mark.slow
def test_regex_and_choice_always_match(llm):
    pattern = r"\d{3}-\d{4}"
    for completion in _generate_all(llm, "My phone number is", GuidedDecodingParams(regex=pattern), range(8), 20):
        assert re.fullmatch(pattern, completion.text), completion.text
    choices = ["apple pie", "banana", "cherry tart"]
    texts = [c.text for c in _generate_all(llm, "My favourite dessert is",
                                           GuidedDecodingParams(choice=choices), range(8), 20)]
    assert set(texts) <= set(choices)
    unguided = llm.generate("My phone number is", SamplingParams(temperature=1.0, seed=0, max_tokens=8),
                            use_tqdm=False)[0].outputs[0].text
    assert not re.fullmatch(pattern, unguided)


@pytest.mark.slow
def test_ebnf_grammar_and_json_object(llm):
    grammar = 'root ::= ("yes" | "no") ", because " [a-z]+ "."'
    for completion in _generate_all(llm, "Is the sea blue?", GuidedDecodingParams(grammar=grammar), range(4), 30):
        if completion.finish_reason == "stop":
            assert re.fullmatch(r"(yes|no), because [a-z]+\.", completion.text), completion.text
        else:
            assert re.fullmatch(r"(yes|no), because [a-z]*", completion.text), completion.text
    output = llm.generate(_chat_prompt(llm, "Give a JSON object with a key 'city'."),
                          SamplingParams(temperature=0.0, max_tokens=60,
                                         guided_decoding=GuidedDecodingParams(json_object=True)),
                          use_tqdm=False)[0].outputs[0]
    assert isinstance(json.loads(output.text), dict)


@pytest.mark.parametrize("guided", [GuidedDecodingParams(json='{"type": "no-such-type"}'),
                                    GuidedDecodingParams(json="{not json"),
                                    GuidedDecodingParams(regex="([a-z]"),
                                    GuidedDecodingParams(grammar="root ::= undefined_rule")])
def test_invalid_constraint_fails_at_add_request(llm, guided):
    engine = llm.llm_engine
    with pytest.raises(ValueError, match="guided decoding"):
        engine.add_request("bad-guide", "Hello", SamplingParams(guided_decoding=guided))
    assert not engine.has_unfinished_requests()


def test_compiled_grammars_are_cached_per_engine(llm):
    grammars = llm.llm_engine.grammars
    guided = GuidedDecodingParams(regex=r"[a-c]{2}")
    assert grammars.compile(guided) is not None
    size = grammars._get_compiler().get_cache_size_bytes()
    grammars.compile(GuidedDecodingParams(regex=r"[a-c]{2}"))
    assert grammars._get_compiler().get_cache_size_bytes() == size > 0


def test_compiled_grammar_cache_is_bounded(llm, monkeypatch):
    """Distinct constraints past VLLM_XGRAMMAR_CACHE_MB push the least recently used out of the cache."""
    monkeypatch.setenv("VLLM_XGRAMMAR_CACHE_MB", "1")
    engine = llm.llm_engine
    grammars = GrammarManager(engine.tokenizer, engine.model_config.vocab_size, engine.grammars.stop_token_ids)
    assert grammars.cache_limit_bytes == 2**20
    compiler = grammars._get_compiler()
    grammars.compile(GuidedDecodingParams(regex="[a-z]{1,2}x"))
    one = compiler.get_cache_size_bytes()
    for i in range(80):
        grammars.compile(GuidedDecodingParams(regex=f"[a-z]{{1,{i + 3}}}x{i}"))
    assert 81 * one > 3 * grammars.cache_limit_bytes  # unbounded, the cache would hold far more
    assert compiler.get_cache_size_bytes() < 1.5 * grammars.cache_limit_bytes


def test_masks_for_proposed_tokens_follow_the_grammar_and_leave_the_matcher_as_it_was(llm, tokenizer):
    """Speculative decoding: row j is the mask after the first j proposals; a proposal the grammar refuses cuts
    the walk (its own row masks it out); the matcher is rolled back to where it was."""
    grammars = llm.llm_engine.grammars
    matcher = grammars.matcher(GuidedDecodingParams(regex=r"[0-9]{3}-[a-z]+"))
    digits, letter = [tokenizer.convert_tokens_to_ids(c) for c in "123"], tokenizer.convert_tokens_to_ids("a")
    masks, failed = grammars.bitmasks({"r": matcher}, {"r": [digits[0], letter, digits[1]]})
    assert not failed and masks["r"].shape[0] == 4
    allowed = [{t for t in (*digits, letter) if (row[t // 32] >> (t % 32)) & 1} for row in masks["r"]]
    assert allowed[0] == allowed[1] == set(digits)  # before and after the first digit: digits only
    assert letter not in allowed[1]  # so the refused proposal is rejected at its own row
    reference, _ = grammars.bitmasks({"r": matcher})  # the matcher did not move
    assert masks["r"][0].equal(reference["r"][0])
    assert num_grammar_tokens(matcher, [*digits, letter, *digits]) == 3  # "123", then "-" was due
    assert num_grammar_tokens(matcher, [letter]) == 0  # still at the start
