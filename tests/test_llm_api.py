"""The rest of vLLM's LLM surface on a tiny model: final outputs whatever the output kind, per-prompt LoRA
requests, the legacy prompt_token_ids and guided_options_request forms, set_tokenizer and apply_model."""
from __future__ import annotations

import types

import pytest
import torch

from pagedllm import LLM, SamplingParams
from pagedllm.engine.llm_requests import GuidedDecodingRequest
from pagedllm.sampling_params import RequestOutputKind

LORA = types.SimpleNamespace(lora_name="adapter", lora_int_id=1, lora_path="/nonexistent")
PROMPTS = ["The sky is", "Once upon a time"]


@pytest.fixture(scope="module")
def tiny_llm(tiny_model_dir):
    return LLM(tiny_model_dir, num_gpu_blocks_override=32)


def greedy(**kwargs) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, **kwargs)


def texts(outputs) -> list[str]:
    return [output.outputs[0].text for output in outputs]


def test_delta_params_still_return_the_whole_text_and_stay_unchanged(tiny_llm):
    delta = greedy(output_kind=RequestOutputKind.DELTA)
    outputs = tiny_llm.generate(PROMPTS, delta, use_tqdm=False)
    assert texts(outputs) == texts(tiny_llm.generate(PROMPTS, greedy(), use_tqdm=False))
    assert all(len(output.outputs[0].token_ids) == 6 for output in outputs)
    assert delta.output_kind == RequestOutputKind.DELTA


def test_a_list_of_lora_requests_is_one_per_prompt(tiny_llm):
    assert len(tiny_llm.generate(PROMPTS, greedy(), use_tqdm=False, lora_request=[None, None])) == 2
    with pytest.raises(ValueError, match="The lengths of prompts and lora_request must be the same."):
        tiny_llm.generate(PROMPTS, greedy(), use_tqdm=False, lora_request=[None])
    with pytest.raises(ValueError, match="LoRA is not enabled"):
        tiny_llm.generate(PROMPTS, greedy(), use_tqdm=False, lora_request=[None, LORA])
    assert not tiny_llm.llm_engine.has_unfinished_requests()


def test_legacy_prompt_token_ids_warn_and_equal_tokens_prompts(tiny_llm):
    ids = [[1, 2, 3], [4, 5, 6, 7]]
    with pytest.warns(DeprecationWarning, match="prompt_token_ids"):
        legacy = tiny_llm.generate(prompt_token_ids=ids, sampling_params=greedy(), use_tqdm=False)
    modern = tiny_llm.generate([{"prompt_token_ids": t} for t in ids], greedy(), use_tqdm=False)
    assert [o.prompt_token_ids for o in legacy] == ids and texts(legacy) == texts(modern)
    with pytest.warns(DeprecationWarning):
        single = tiny_llm.generate(prompt_token_ids=ids[0], sampling_params=greedy(), use_tqdm=False)
    assert texts(single) == texts(modern)[:1]


@pytest.mark.parametrize("options", [{"guided_choice": ["yes", "no"]},
                                     GuidedDecodingRequest(guided_choice=["yes", "no"])])
def test_guided_options_request_constrains_every_prompt(tiny_llm, options):
    with pytest.warns(DeprecationWarning, match="guided_options_request is deprecated"):
        outputs = tiny_llm.generate(PROMPTS, SamplingParams(temperature=1.0, seed=1, max_tokens=4),
                                    use_tqdm=False, guided_options_request=options)
    assert set(texts(outputs)) <= {"yes", "no"}


@pytest.mark.filterwarnings("ignore:guided_options_request is deprecated")
def test_guided_options_request_conflicts(tiny_llm):
    with pytest.raises(ValueError, match="only use one guided decoding"):
        tiny_llm.generate(PROMPTS, greedy(), use_tqdm=False, guided_options_request={"guided_choice": ["a"],
                                                                                     "guided_regex": "a"})
    guided = SamplingParams(max_tokens=2, guided_decoding={"regex": "[ab]"})
    with pytest.raises(ValueError, match="Cannot set both guided_options_request and params.guided_decoding"):
        tiny_llm.generate(PROMPTS, guided, use_tqdm=False, guided_options_request={"guided_choice": ["a"]})


def test_set_tokenizer_is_used_for_the_next_requests(tiny_llm):
    original = tiny_llm.get_tokenizer()
    calls = []

    class Recording:
        def __getattr__(self, name):
            return getattr(original, name)

        def __len__(self):
            return len(original)

        def encode(self, text, **kwargs):
            calls.append(text)
            return original.encode(text, **kwargs)

    expected = texts(tiny_llm.generate(PROMPTS, greedy(), use_tqdm=False))
    tiny_llm.set_tokenizer(Recording())
    try:
        assert texts(tiny_llm.generate(PROMPTS, greedy(), use_tqdm=False)) == expected
        assert calls == PROMPTS
    finally:
        tiny_llm.set_tokenizer(original)
    assert tiny_llm.get_tokenizer() is original


def test_apply_model_runs_on_the_model_in_each_worker(tiny_llm):
    counts = tiny_llm.apply_model(lambda model: sum(p.numel() for p in model.parameters()))
    assert len(counts) == 1 and counts[0] > 0
    assert tiny_llm.apply_model(lambda model: isinstance(model, torch.nn.Module)) == [True]


def test_a_callable_use_tqdm_makes_the_progress_bar(tiny_llm):
    made = []

    def bar(**kwargs):
        from tqdm import tqdm

        made.append(kwargs["total"])
        return tqdm(disable=True, **kwargs)

    tiny_llm.generate(PROMPTS, greedy(), use_tqdm=bar)
    assert made == [2]
