"""SamplingParams, GuidedDecodingParams and BeamSearchParams validation: bad values fail at construction."""
from __future__ import annotations

import pytest

from pagedllm.sampling_params import BeamSearchParams, GuidedDecodingParams, RequestOutputKind, SamplingParams

INVALID = [
    ("n", {"n": 0}),
    ("n", {"n": 1.5}),
    ("best_of", {"n": 3, "best_of": 2}),
    ("best_of", {"best_of": 2, "temperature": 0.0}),
    ("presence_penalty", {"presence_penalty": 2.5}),
    ("presence_penalty", {"presence_penalty": -2.01}),
    ("frequency_penalty", {"frequency_penalty": 3.0}),
    ("repetition_penalty", {"repetition_penalty": 0.0}),
    ("repetition_penalty", {"repetition_penalty": -1.0}),
    ("repetition_penalty", {"repetition_penalty": 1.1e-308}),  # penalized logits would overflow float32
    ("repetition_penalty", {"repetition_penalty": 1e21}),
    ("temperature", {"temperature": -0.5}),
    ("top_p", {"top_p": 0.0}),
    ("top_p", {"top_p": 1.2}),
    ("top_k", {"top_k": -2}),
    ("top_k", {"top_k": 2.5}),
    ("min_p", {"min_p": 1.5}),
    ("min_p", {"min_p": -0.1}),
    ("max_tokens", {"max_tokens": 0}),
    ("min_tokens", {"min_tokens": -1}),
    ("min_tokens", {"min_tokens": 10, "max_tokens": 5}),
    ("logprobs", {"logprobs": -1}),
    ("prompt_logprobs", {"prompt_logprobs": -3}),
    ("truncate_prompt_tokens", {"truncate_prompt_tokens": 0}),
    ("stop", {"stop": [""]}),
    ("stop", {"stop": ["x"], "detokenize": False}),
    ("stop_token_ids", {"stop_token_ids": [-1]}),
    ("bad_words", {"bad_words": ["  "]}),
    ("allowed_token_ids", {"allowed_token_ids": []}),
    ("seed", {"seed": "42"}),
    ("logits_processors", {"logits_processors": [42]}),
    ("output_kind", {"output_kind": "delta"}),
    ("logit_bias", {"logit_bias": {"a": 1.0}}),
    ("guided_decoding", {"guided_decoding": "json"}),
]


@pytest.mark.parametrize("field,kwargs", INVALID, ids=[f"{f}-{i}" for i, (f, _) in enumerate(INVALID)])
def test_invalid_value_raises_value_error_naming_the_field(field, kwargs):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def test_valid_defaults_match_vllm():
    params = SamplingParams()
    assert (params.n, params.best_of, params.temperature, params.top_p, params.top_k, params.min_p) == (
        1, None, 1.0, 1.0, 0, 0.0)
    assert (params.max_tokens, params.min_tokens, params.repetition_penalty) == (16, 0, 1.0)
    assert params.stop == [] and params.stop_token_ids == [] and params.bad_words == []
    assert params.output_kind == RequestOutputKind.CUMULATIVE and params.detokenize and params.skip_special_tokens


def test_tiny_temperature_is_clamped_and_greedy_turns_filters_off():
    assert SamplingParams(temperature=0.001).temperature == 0.01
    greedy = SamplingParams(temperature=0.0, top_p=0.5, top_k=3, min_p=0.2)
    assert (greedy.top_p, greedy.top_k, greedy.min_p) == (1.0, 0, 0.0)


def test_logit_bias_is_clamped_to_100():
    assert SamplingParams(logit_bias={"5": 250, 7: -300.0}).logit_bias == {5: 100.0, 7: -100.0}


@pytest.mark.parametrize("kwargs,message", [
    ({"json": {"type": "object"}, "regex": "a+"}, "only use one kind"),
    ({}, "must specify one of"),
    ({"choice": []}, "choice"),
    ({"regex": "a+", "backend": "outlines"}, "backend"),
])
def test_guided_decoding_params_validation(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GuidedDecodingParams(**kwargs)


def test_guided_decoding_from_dict_and_backend_options():
    params = SamplingParams(guided_decoding={"regex": "[0-9]+", "backend": "xgrammar:disable-any-whitespace"})
    assert params.guided_decoding.kind == "regex" and params.guided_decoding.disable_any_whitespace


@pytest.mark.parametrize("kwargs", [{"beam_width": 0, "max_tokens": 4}, {"beam_width": 2, "max_tokens": 0},
                                    {"beam_width": 2, "max_tokens": 4, "temperature": -1.0}])
def test_beam_search_params_validation(kwargs):
    with pytest.raises(ValueError):
        BeamSearchParams(**kwargs)


def test_vllm_spellings_seed_minus_one_and_logprobs_true():
    params = SamplingParams(seed=-1, logprobs=True, prompt_logprobs=True)
    assert params.seed is None and params.logprobs == 1 and params.prompt_logprobs == 1
    assert SamplingParams(logprobs=False).logprobs == 0


@pytest.mark.parametrize("kwargs, message", [
    ({"n": 2, "temperature": 0.0}, "n must be 1 when using greedy sampling, got 2."),
    ({"n": 2, "best_of": 3, "output_kind": RequestOutputKind.DELTA}, "best_of must equal n to use output_kind=DELTA"),
])
def test_vllms_errors_for_greedy_n_and_delta_best_of(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)
    assert SamplingParams(n=2, best_of=2, output_kind=RequestOutputKind.DELTA).best_of == 2


def test_from_optional_takes_none_as_the_default():
    params = SamplingParams.from_optional(n=None, temperature=None, top_p=None, presence_penalty=None,
                                          frequency_penalty=None, repetition_penalty=None, max_tokens=5, seed=None)
    assert (params.n, params.temperature, params.top_p, params.max_tokens, params.seed) == (1, 1.0, 1.0, 5, None)
    assert (params.presence_penalty, params.frequency_penalty, params.repetition_penalty) == (0.0, 0.0, 1.0)
    positional = SamplingParams.from_optional(3, None, None, None, None, 0.5)
    assert (positional.n, positional.temperature, positional.presence_penalty) == (3, 0.5, 0.0)
    assert SamplingParams.from_optional(logit_bias={"7": 500}).logit_bias == {7: 100.0}


def test_update_from_generation_config_adds_the_extra_eos_ids_as_stop_tokens():
    params = SamplingParams(stop_token_ids=[9])
    params.update_from_generation_config({"eos_token_id": [2, 5]}, model_eos_token_id=2)
    assert params.stop_token_ids == [5, 9] and params.all_stop_token_ids == {5, 9}
    ignoring = SamplingParams(ignore_eos=True)
    ignoring.update_from_generation_config({"eos_token_id": 5}, model_eos_token_id=2)
    assert ignoring.stop_token_ids == [] and not ignoring.all_stop_token_ids
    untouched = SamplingParams()
    untouched.update_from_generation_config({"temperature": 0.3}, model_eos_token_id=2)
    assert untouched.stop_token_ids == [] and not untouched.all_stop_token_ids
