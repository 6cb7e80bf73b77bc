"""The engine's side of pooling requests: their parameters checked against the model, their prompts against
its limits, and their pooled data made `PoolingRequestOutput`s."""
from __future__ import annotations

from typing import Any, AsyncGenerator, Mapping, Optional, Union

import torch

from pagedllm.config import ModelConfig
from pagedllm.engine.request_state import RequestState
from pagedllm.inputs import TokensPrompt
from pagedllm.outputs import PoolingOutput, PoolingRequestOutput
from pagedllm.pooling.config import is_encoder, model_tasks
from pagedllm.pooling_params import TOKEN_TYPE_SPLIT, PoolingParams
from pagedllm.sampling_params import SamplingParams

# The request tasks each model task serves ("encode": the pooled hidden states, or a classifier's logits, as
# the pooler config leaves them); a classifier scores pairs only where it is a cross-encoder (one label).
_REQUEST_TASKS = {"embed": ("embed", "encode"), "reward": ("encode",), "classify": ("classify", "score", "encode"),
                  "score": ("classify", "score", "encode")}


def check_params_kind(params: Any, model_config: ModelConfig) -> None:
    """A generating model takes SamplingParams, a pooling model PoolingParams."""
    if not isinstance(params, (SamplingParams, PoolingParams)):
        raise TypeError(f"params must be SamplingParams or PoolingParams, got {type(params).__name__}.")
    if model_config.runner_type == "pooling" and isinstance(params, SamplingParams):
        raise ValueError(f"This model runs task={model_config.task!r} and takes PoolingParams; text generation "
                         "(SamplingParams) needs a model run with task='generate'.")
    if model_config.runner_type == "generate" and isinstance(params, PoolingParams):
        raise ValueError("This model runs task='generate' and takes SamplingParams; pooling (PoolingParams: "
                         "embed, classify, score, reward) needs the model run with a pooling task, e.g. "
                         "task='embed'.")


def prepare_pooling_params(params: PoolingParams, token_ids: list[int], model_config: ModelConfig,
                           max_num_batched_tokens: int, token_type_ids: Optional[list[int]] = None) -> PoolingParams:
    """A copy of `params` with its task set and checked, the prompt's token types (from the prompt's
    `token_type_ids`, if given) in its extra_kwargs, the prompt truncated if asked and checked: a pooling model
    runs the whole prompt in one pass, so it must fit both the model and one step."""
    default_task = model_config.task if model_config.task in ("embed", "classify", "score") else "encode"
    params = params.with_task(params.task or default_task)
    served = [t for t in _REQUEST_TASKS[model_config.task]
              if t != "score" or "score" in model_tasks(model_config.hf_config)]
    if params.task not in served:
        raise ValueError(f"This model runs task={model_config.task!r} and cannot serve {params.task!r} requests; "
                         f"it serves: {', '.join(served)}.")
    params.verify(params.task, model_config.hf_config.hidden_size)
    if token_type_ids is not None:
        _take_token_types(params, token_type_ids, len(token_ids), model_config)
    if params.truncate_prompt_tokens is not None:
        _truncate_token_types(params, len(token_ids) - params.truncate_prompt_tokens)
        del token_ids[:-params.truncate_prompt_tokens]
    _check_token_types(params, len(token_ids), model_config)
    if not token_ids:
        raise ValueError("The prompt cannot be empty")
    limit = min(model_config.max_model_len, max_num_batched_tokens)
    if len(token_ids) > limit:
        raise ValueError(f"The prompt (length {len(token_ids)}) is longer than the maximum model length of {limit}. "
                         "A pooling model runs the whole prompt in one pass: chunking is not allowed for an "
                         "encoder. Shorten the prompt or set truncate_prompt_tokens.")
    return params


def _truncate_token_types(params: PoolingParams, removed: int) -> None:
    """Keep a pair's split where it was in the text once the first `removed` tokens are cut."""
    split = (params.extra_kwargs or {}).get(TOKEN_TYPE_SPLIT)
    if split is not None and removed > 0:
        params.extra_kwargs = {**params.extra_kwargs, TOKEN_TYPE_SPLIT: max(0, split - removed)}


def _take_token_types(params: PoolingParams, token_type_ids: list[int], num_tokens: int,
                      model_config: ModelConfig) -> None:
    """Carry a prompt's token types the way a text pair's travel: the index of the first token of type 1
    (none when every token is of type 0), so the types must be zeros then ones, as vLLM compresses them."""
    _check_reads_token_types(model_config)
    if TOKEN_TYPE_SPLIT in (params.extra_kwargs or {}):
        raise ValueError(f"Give a prompt's token_type_ids or extra_kwargs[{TOKEN_TYPE_SPLIT!r}], not both.")
    if len(token_type_ids) != num_tokens:
        raise ValueError(f"token_type_ids must have one entry per prompt token: got {len(token_type_ids)} for "
                         f"{num_tokens} prompt_token_ids.")
    type_vocab_size = model_config.hf_config.type_vocab_size
    outside = sorted({t for t in token_type_ids if not 0 <= t < type_vocab_size})
    if outside:
        raise ValueError(f"token_type_ids must be within the model's type_vocab_size ({type_vocab_size}): "
                         f"0 to {type_vocab_size - 1}, got {outside}.")
    split = token_type_ids.index(1) if 1 in token_type_ids else num_tokens
    if any(t != (i >= split) for i, t in enumerate(token_type_ids)):
        raise ValueError("token_type_ids must be zeros then ones (a text pair's first text, then its second).")
    if split < num_tokens:
        params.extra_kwargs = {**(params.extra_kwargs or {}), TOKEN_TYPE_SPLIT: split}


def _check_reads_token_types(model_config: ModelConfig) -> None:
    if not is_encoder(model_config.hf_config):
        raise ValueError("token_type_ids are only read by encoder models (BERT); this model has no token types.")


def _check_token_types(params: PoolingParams, num_tokens: int, model_config: ModelConfig) -> None:
    split = (params.extra_kwargs or {}).get(TOKEN_TYPE_SPLIT)
    if split is None:
        return
    _check_reads_token_types(model_config)
    if not isinstance(split, int) or not 0 <= split <= num_tokens:
        raise ValueError(f"extra_kwargs[{TOKEN_TYPE_SPLIT!r}] must be a token index within the prompt "
                         f"(0 to {num_tokens}), got {split!r}.")


def is_cross_encoder(model_config: ModelConfig) -> bool:
    """A classifier that scores a text pair in one pass (one label)."""
    return model_config.task in ("classify", "score") and "score" in model_tasks(model_config.hf_config)


def pair_request(tokenizer: Any, text_1: str, text_2: str, model_config: ModelConfig,
                 params: PoolingParams) -> tuple[TokensPrompt, PoolingParams]:
    """A cross-encoder's prompt for one pair, tokenized together as its tokenizer joins pairs; for an encoder,
    the params carry where the second text's token type starts."""
    if not isinstance(text_1, str) or not isinstance(text_2, str):
        raise ValueError("A cross-encoder scores pairs of texts: both items of each pair must be strings.")
    encoded = tokenizer(text_1, text_2)
    params = params.with_task("score")
    types = encoded.get("token_type_ids")
    if is_encoder(model_config.hf_config) and types is not None and 1 in types:
        params.extra_kwargs = {**(params.extra_kwargs or {}), TOKEN_TYPE_SPLIT: types.index(1)}
    return TokensPrompt(prompt_token_ids=list(encoded["input_ids"])), params


def pooling_output(state: RequestState, data: Union[list, float]) -> PoolingRequestOutput:
    """The one, final output of a pooling request."""
    return PoolingRequestOutput(state.request_id, PoolingOutput(torch.tensor(data, dtype=torch.float32)),
                                state.request.prompt_token_ids, True, state.metrics)


class PoolingClientMixin:
    """`encode` for an async engine client whose `generate` also takes PoolingParams (in-process or across the
    engine process): a pooling request is a generate call with one final output."""

    async def encode(self, prompt: Any, pooling_params: PoolingParams, request_id: str, lora_request: Any = None,
                     trace_headers: Optional[Mapping[str, str]] = None,
                     priority: int = 0) -> AsyncGenerator[PoolingRequestOutput, None]:
        """Yield a pooling request's one output; the engine must run a pooling task."""
        async for output in self.generate(prompt, pooling_params, request_id, lora_request, trace_headers, priority):
            yield output
