"""`LLM`'s pooling calls: encode, embed, classify, score and reward, one final output per prompt."""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Union

import torch

from pagedllm.engine.pooling import is_cross_encoder, pair_request
from pagedllm.inputs import PromptType
from pagedllm.outputs import (ClassificationRequestOutput, EmbeddingRequestOutput, PoolingOutput,
                              PoolingRequestOutput, ScoringRequestOutput)
from pagedllm.pooling_params import PoolingParams

Prompts = Union[PromptType, Sequence[PromptType]]
Tqdm = Union[bool, Callable[..., Any]]


class PoolingMixin:
    """Needs the LLM's `llm_engine`, `_request_counter` and `_run_engine`."""

    def encode(self, prompts: Prompts, pooling_params: Union[PoolingParams, Sequence[PoolingParams], None] = None,
               *, truncate_prompt_tokens: Optional[int] = None, use_tqdm: Tqdm = True, lora_request: Any = None,
               prompt_adapter_request: Any = None, pooling_task: str = "encode") -> list[PoolingRequestOutput]:
        """Pool every prompt (`pooling_task`: "encode" for the pooled hidden states, or "embed", "classify",
        "score"); outputs in the prompts' order."""
        if prompt_adapter_request is not None:
            raise ValueError("prompt_adapter_request is not supported by pagedllm: prompt adapters are not "
                             "implemented.")
        prompt_list = [prompts] if isinstance(prompts, (str, dict)) else list(prompts)
        if pooling_params is None or isinstance(pooling_params, PoolingParams):
            params_list = [pooling_params or PoolingParams()] * len(prompt_list)
        else:
            params_list = list(pooling_params)
            if len(params_list) != len(prompt_list):
                raise ValueError("The lengths of prompts and pooling_params must be the same.")
        ids = []
        try:
            for prompt, params in zip(prompt_list, params_list):
                params = params.with_task(pooling_task)
                if truncate_prompt_tokens is not None:
                    params.truncate_prompt_tokens = truncate_prompt_tokens
                request_id = str(next(self._request_counter))
                self.llm_engine.add_request(request_id, prompt, params, lora_request=lora_request)
                ids.append(request_id)
        except Exception:
            self.llm_engine.abort_request(ids)
            raise
        return self._run_engine(ids, use_tqdm)

    def embed(self, prompts: Prompts, *, truncate_prompt_tokens: Optional[int] = None, use_tqdm: Tqdm = True,
              pooling_params: Union[PoolingParams, Sequence[PoolingParams], None] = None,
              lora_request: Any = None) -> list[EmbeddingRequestOutput]:
        """One embedding per prompt (`.outputs.embedding`)."""
        outputs = self.encode(prompts, pooling_params, truncate_prompt_tokens=truncate_prompt_tokens,
                              use_tqdm=use_tqdm, lora_request=lora_request, pooling_task="embed")
        return [EmbeddingRequestOutput.from_base(output) for output in outputs]

    def classify(self, prompts: Prompts, *, use_tqdm: Tqdm = True,
                 pooling_params: Union[PoolingParams, Sequence[PoolingParams], None] = None,
                 lora_request: Any = None) -> list[ClassificationRequestOutput]:
        """Class probabilities per prompt (`.outputs.probs`); needs a classification model
        (`*ForSequenceClassification`)."""
        outputs = self.encode(prompts, pooling_params, use_tqdm=use_tqdm, lora_request=lora_request,
                              pooling_task="classify")
        return [ClassificationRequestOutput.from_base(output) for output in outputs]

    def reward(self, prompts: Prompts, *, truncate_prompt_tokens: Optional[int] = None, use_tqdm: Tqdm = True,
               pooling_params: Union[PoolingParams, Sequence[PoolingParams], None] = None,
               lora_request: Any = None) -> list[PoolingRequestOutput]:
        """The reward model's output per prompt (its pooled hidden states)."""
        return self.encode(prompts, pooling_params, truncate_prompt_tokens=truncate_prompt_tokens,
                           use_tqdm=use_tqdm, lora_request=lora_request, pooling_task="encode")

    def score(self, data_1: Union[PromptType, Sequence[PromptType]], data_2: Union[PromptType, Sequence[PromptType]],
              /, *, truncate_prompt_tokens: Optional[int] = None, use_tqdm: Tqdm = True,
              pooling_params: Optional[PoolingParams] = None, lora_request: Any = None
              ) -> list[ScoringRequestOutput]:
        """Score pairs: one first item against each second item, or the two lists pairwise. A cross-encoder
        (a one-label classifier) scores each pair of texts in one pass; an embedding model scores a pair by the
        cosine similarity of the two embeddings."""
        model_config = self.llm_engine.model_config
        firsts = [data_1] if isinstance(data_1, (str, dict)) else list(data_1)
        seconds = [data_2] if isinstance(data_2, (str, dict)) else list(data_2)
        if len(firsts) == 1:
            firsts = firsts * len(seconds)
        if len(firsts) != len(seconds) or not seconds:
            raise ValueError(f"score takes one item against N or N against N, got {len(firsts)} and {len(seconds)}.")
        kwargs = dict(truncate_prompt_tokens=truncate_prompt_tokens, use_tqdm=use_tqdm, lora_request=lora_request)
        if is_cross_encoder(model_config):
            pairs = [pair_request(self.get_tokenizer(), a, b, model_config, pooling_params or PoolingParams())
                     for a, b in zip(firsts, seconds)]
            outputs = self.encode([prompt for prompt, _ in pairs], [params for _, params in pairs],
                                  pooling_task="score", **kwargs)
            return [ScoringRequestOutput.from_base(output) for output in outputs]
        if model_config.task != "embed":
            raise ValueError(f"LLM.score needs an embedding model (task='embed') or a cross-encoder (a "
                             f"*ForSequenceClassification model with one label); this model runs "
                             f"task={model_config.task!r}.")
        if pooling_params is not None:
            pooling_params.verify("embed")
        embeddings = self.encode(firsts + seconds, pooling_params, pooling_task="embed", **kwargs)
        n = len(firsts)
        return [_cosine_score(a, b) for a, b in zip(embeddings[:n], embeddings[n:])]


def _cosine_score(a: PoolingRequestOutput, b: PoolingRequestOutput) -> ScoringRequestOutput:
    score = torch.nn.functional.cosine_similarity(a.outputs.data, b.outputs.data, dim=0)
    return ScoringRequestOutput.from_base(PoolingRequestOutput(
        f"{a.request_id}_{b.request_id}", PoolingOutput(score), a.prompt_token_ids + b.prompt_token_ids, True))
