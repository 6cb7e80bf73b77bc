"""pagedllm: an LLM inference and serving engine with vLLM's public API."""
from pagedllm.config import AsyncEngineArgs, EngineArgs
from pagedllm.engine.async_engine import AsyncLLMEngine
from pagedllm.engine.llm import LLM
from pagedllm.engine.llm_engine import LLMEngine
from pagedllm.inputs import PromptType, TextPrompt, TokensPrompt
from pagedllm.lora.request import LoRARequest
from pagedllm.outputs import (ClassificationOutput, ClassificationRequestOutput, CompletionOutput, EmbeddingOutput,
                              EmbeddingRequestOutput, Logprob, PoolingOutput, PoolingRequestOutput, RequestMetrics,
                              RequestOutput, ScoringOutput, ScoringRequestOutput)
from pagedllm.pooling_params import PoolingParams
from pagedllm.sampling_params import BeamSearchParams, RequestOutputKind, SamplingParams

__version__ = "0.1.0"

__all__ = [
    "LLM", "LLMEngine", "AsyncLLMEngine", "EngineArgs", "AsyncEngineArgs", "SamplingParams", "BeamSearchParams",
    "RequestOutputKind", "PoolingParams",
    "RequestOutput", "CompletionOutput", "PoolingRequestOutput", "RequestMetrics", "Logprob",
    "PoolingOutput", "EmbeddingOutput", "EmbeddingRequestOutput", "ClassificationOutput",
    "ClassificationRequestOutput", "ScoringOutput", "ScoringRequestOutput",
    "PromptType", "TextPrompt", "TokensPrompt", "LoRARequest", "__version__",
]
