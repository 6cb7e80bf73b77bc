"""What `LLM.generate`'s arguments become before they reach the engine: vLLM's legacy prompt and guided-decoding
forms converted, and each request's parameters set to return one final output."""
from __future__ import annotations

import warnings
from dataclasses import dataclass, fields
from typing import Any, Optional, Sequence, Union

from pagedllm.inputs import PromptType, TextPrompt, TokensPrompt
from pagedllm.sampling_params import GuidedDecodingParams, RequestOutputKind, SamplingParams


@dataclass
class GuidedDecodingRequest:
    """vLLM's deprecated per-call guided decoding options (`LLM.generate(guided_options_request=...)`)."""

    guided_json: Optional[Union[dict, str]] = None
    guided_regex: Optional[str] = None
    guided_choice: Optional[list[str]] = None
    guided_grammar: Optional[str] = None
    guided_decoding_backend: Optional[str] = None
    guided_whitespace_pattern: Optional[str] = None
    guided_json_object: Optional[bool] = None
    structural_tag: Optional[str] = None

    def __post_init__(self) -> None:
        given = [f.name for f in fields(self) if f.name.startswith("guided_") and f.name not in (
            "guided_decoding_backend", "guided_whitespace_pattern") and getattr(self, f.name) is not None]
        if len(given) > 1:
            raise ValueError(f"You can only use one kind of guided decoding but multiple are specified: {given}")

    def to_params(self) -> GuidedDecodingParams:
        return GuidedDecodingParams(
            json=self.guided_json, regex=self.guided_regex, choice=self.guided_choice, grammar=self.guided_grammar,
            json_object=self.guided_json_object, backend=self.guided_decoding_backend,
            whitespace_pattern=self.guided_whitespace_pattern, structural_tag=self.structural_tag)


def legacy_prompts(prompts: Optional[Union[str, list[str]]],
                   prompt_token_ids: Union[list[int], list[list[int]]]) -> list[PromptType]:
    """vLLM's deprecated `generate(prompt_token_ids=...)`: token id lists (one, or one per prompt) as prompts."""
    warnings.warn(DeprecationWarning("The keyword arguments {'prompt_token_ids'} are deprecated and will be removed "
                                     "in a future update. Please use the 'prompts' parameter instead."),
                  stacklevel=3)
    token_lists = [prompt_token_ids] if prompt_token_ids and isinstance(prompt_token_ids[0], int) \
        else list(prompt_token_ids)
    texts = [prompts] if isinstance(prompts, str) else prompts
    if texts is not None and len(texts) != len(token_lists):
        raise ValueError("The lengths of prompts and prompt_token_ids must be the same.")
    # As in vLLM, the token ids are only used when no text is given.
    if texts is not None:
        return [TextPrompt(prompt=text) for text in texts]
    return [TokensPrompt(prompt_token_ids=list(ids)) for ids in token_lists]


def guided_options(options: Union[GuidedDecodingRequest, dict, None]) -> Optional[GuidedDecodingParams]:
    """vLLM's deprecated `guided_options_request` (a GuidedDecodingRequest or its dict) as GuidedDecodingParams."""
    if options is None:
        return None
    warnings.warn("guided_options_request is deprecated, use SamplingParams.guided_decoding instead",
                  DeprecationWarning, stacklevel=3)
    if isinstance(options, dict):
        if len(options) > 1:
            raise ValueError(f"You can only use one guided decoding but multiple is specified: {options}")
        options = GuidedDecodingRequest(**options)
    return options.to_params()


def final_only_params(params_list: Sequence[SamplingParams],
                      guided: Optional[GuidedDecodingParams]) -> list[SamplingParams]:
    """Copies that return one output when each request finishes (`generate` keeps only that one, so a DELTA
    request would otherwise come back as its last fragment), with the call's guided decoding added."""
    copies: dict[int, SamplingParams] = {}
    for params in params_list:
        if id(params) in copies:
            continue
        if guided is not None and params.guided_decoding is not None:
            raise ValueError("Cannot set both guided_options_request and params.guided_decoding.")
        copy = params.clone()
        copy.output_kind = RequestOutputKind.FINAL_ONLY
        if guided is not None:
            copy.guided_decoding = guided
        copies[id(params)] = copy
    return [copies[id(params)] for params in params_list]


def per_prompt(value: Any, num_prompts: int, name: str) -> list[Any]:
    """One value for every prompt, or a list with one per prompt."""
    if isinstance(value, (list, tuple)):
        if len(value) != num_prompts:
            raise ValueError(f"The lengths of prompts and {name} must be the same.")
        return list(value)
    return [value] * num_prompts
