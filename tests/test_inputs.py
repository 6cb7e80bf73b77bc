"""Prompt forms: each accepted one parses to its source; multimodal data is refused, never dropped."""
from __future__ import annotations

import pytest

from pagedllm.inputs import parse_prompt


def test_prompt_forms_parse_to_their_source():
    assert parse_prompt("Hi") == ("Hi", None, None, None)
    assert parse_prompt({"prompt": "Hi", "multi_modal_data": None}) == ("Hi", None, None, None)
    assert parse_prompt({"prompt_token_ids": [1, 2]}).token_ids == [1, 2]
    assert parse_prompt({"prompt_token_ids": [1, 2], "token_type_ids": [0, 1]}).token_type_ids == [0, 1]


@pytest.mark.parametrize("prompt", [{"prompt": "Describe", "multi_modal_data": {"image": object()}},
                                    {"prompt_token_ids": [1, 2], "multi_modal_data": {"audio": object()}}])
def test_multi_modal_data_is_refused(prompt):
    with pytest.raises(ValueError, match="multi_modal_data is not supported"):
        parse_prompt(prompt)


@pytest.mark.parametrize("types", ["", 0, [0, "1"]])
def test_token_type_ids_that_are_not_a_list_of_integers_are_refused(types):
    with pytest.raises(TypeError, match="token_type_ids must be a list of integers"):
        parse_prompt({"prompt_token_ids": [1, 2], "token_type_ids": types})
