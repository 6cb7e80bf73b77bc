"""The engine's side of pooling requests: their parameters checked against the model, their prompts against
its limits, and their pooled data made `PoolingRequestOutput`s."""
from __future__ import annotations

from typing import Any, Union

import torch

from pagedllm.config import ModelConfig
from pagedllm.engine.request_state import RequestState
from pagedllm.outputs import PoolingOutput, PoolingRequestOutput
from pagedllm.pooling_params import PoolingParams
from pagedllm.sampling_params import SamplingParams

# The request tasks each model task serves ("encode": the pooled hidden states as they are).
_REQUEST_TASKS = {"embed": ("embed", "encode"), "reward": ("encode",)}


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
                           max_num_batched_tokens: int) -> PoolingParams:
    """A copy of `params` with its task set and checked, the prompt truncated if asked and checked: a
    pooling model runs the whole prompt in one pass, so it must fit both the model and one step."""
    default_task = "embed" if model_config.task == "embed" else "encode"
    params = params.with_task(params.task or default_task)
    if params.task not in _REQUEST_TASKS[model_config.task]:
        raise ValueError(f"This model runs task={model_config.task!r} and cannot serve {params.task!r} requests; "
                         f"it serves: {', '.join(_REQUEST_TASKS[model_config.task])}.")
    params.verify(params.task, model_config.hf_config.hidden_size)
    if params.truncate_prompt_tokens is not None:
        del token_ids[:-params.truncate_prompt_tokens]
    if not token_ids:
        raise ValueError("The prompt cannot be empty")
    limit = min(model_config.max_model_len, max_num_batched_tokens)
    if len(token_ids) > limit:
        raise ValueError(f"The prompt (length {len(token_ids)}) is longer than the maximum model length of {limit}. "
                         "A pooling model runs the whole prompt in one pass: chunking is not allowed for an "
                         "encoder. Shorten the prompt or set truncate_prompt_tokens.")
    return params


def pooling_output(state: RequestState, data: Union[list, float]) -> PoolingRequestOutput:
    """The one, final output of a pooling request."""
    return PoolingRequestOutput(state.request_id, PoolingOutput(torch.tensor(data, dtype=torch.float32)),
                                state.request.prompt_token_ids, True, state.metrics)
