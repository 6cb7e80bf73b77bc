"""LLM: offline batched inference over an LLMEngine, with a progress bar (pooling calls: llm_pooling.py)."""
from __future__ import annotations

import functools
import itertools
from typing import Any, Callable, Optional, Sequence, TypeVar, Union

from pagedllm.config import EngineArgs
from pagedllm.engine.beam_search import BeamSearchOutput, beam_search
from pagedllm.engine.engine_compat import UsageContext
from pagedllm.engine.llm_engine import LLMEngine
from pagedllm.engine.llm_pooling import PoolingMixin
from pagedllm.engine.llm_requests import (GuidedDecodingRequest, final_only_params, guided_options, legacy_prompts,
                                          per_prompt)
from pagedllm.inputs import PromptType, parse_prompt
from pagedllm.lora.request import LoRARequest
from pagedllm.outputs import Logprob, RequestOutput
from pagedllm.sampling_params import BeamSearchParams, SamplingParams

ChatMessages = list[dict[str, Any]]
_R = TypeVar("_R")


class LLM(PoolingMixin):
    """`LLM(model, **engine_args)`: the same keyword arguments as EngineArgs; stats logging off by default."""

    def __init__(self, model: Optional[str] = None, **kwargs: Any) -> None:
        kwargs.setdefault("disable_log_stats", True)
        self.llm_engine = LLMEngine.from_engine_args(EngineArgs(model=model, **kwargs), UsageContext.LLM_CLASS)
        self._request_counter = itertools.count()

    def get_tokenizer(self, lora_request: Any = None) -> Any:
        return self.llm_engine.get_tokenizer(lora_request)

    def set_tokenizer(self, tokenizer: Any) -> None:
        """Encode and decode the following requests with `tokenizer`."""
        self.llm_engine.get_tokenizer_group().tokenizer = tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        return self.llm_engine.get_default_sampling_params()

    def apply_model(self, func: Callable[[Any], _R]) -> list[_R]:
        """Run `func` on the model (a torch.nn.Module) in each worker; one result per worker."""
        return self.llm_engine.collective_rpc(functools.partial(_call_on_model, func))

    def generate(self, prompts: Union[PromptType, Sequence[PromptType], None] = None,
                 sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
                 prompt_token_ids: Union[list[int], list[list[int]], None] = None,
                 use_tqdm: Union[bool, Callable[..., Any]] = True, lora_request: Any = None,
                 prompt_adapter_request: Any = None,
                 guided_options_request: Union[GuidedDecodingRequest, dict, None] = None,
                 priority: Optional[list[int]] = None) -> list[RequestOutput]:
        """Generate for every prompt; outputs come back in the prompts' order, each request's final one only.

        `lora_request` and `sampling_params` may be one for all prompts or a list with one per prompt.
        """
        if prompt_adapter_request is not None:
            raise ValueError("prompt_adapter_request is not supported by pagedllm: prompt adapters are not "
                             "implemented.")
        if prompt_token_ids is not None:
            prompts = legacy_prompts(prompts, prompt_token_ids)
        elif prompts is None:
            raise ValueError("Either prompts or prompt_token_ids must be provided.")
        guided = guided_options(guided_options_request)
        prompt_list = [prompts] if isinstance(prompts, (str, dict)) else list(prompts)
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        params_list = final_only_params(per_prompt(sampling_params, len(prompt_list), "sampling_params"), guided)
        lora_list = per_prompt(lora_request, len(prompt_list), "lora_request")
        if priority is not None and len(priority) != len(prompt_list):
            raise ValueError("The lengths of prompts and priority must be the same.")
        ids = []
        try:
            for i, (prompt, params) in enumerate(zip(prompt_list, params_list)):
                request_id = str(next(self._request_counter))
                self.llm_engine.add_request(request_id, prompt, params, lora_request=lora_list[i],
                                            priority=priority[i] if priority else 0)
                ids.append(request_id)
        except Exception:
            self.llm_engine.abort_request(ids)
            raise
        return self.llm_engine.validate_outputs(self._run_engine(ids, use_tqdm), RequestOutput)

    def chat(self, messages: Union[ChatMessages, list[ChatMessages]],
             sampling_params: Union[SamplingParams, Sequence[SamplingParams], None] = None,
             use_tqdm: bool = True, lora_request: Any = None, chat_template: Optional[str] = None,
             add_generation_prompt: bool = True, continue_final_message: bool = False,
             tools: Optional[list[dict[str, Any]]] = None,
             chat_template_kwargs: Optional[dict[str, Any]] = None) -> list[RequestOutput]:
        """Generate replies to conversations rendered by the tokenizer's chat template."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        tokenizer = self.get_tokenizer()
        prompts = [{"prompt_token_ids": tokenizer.apply_chat_template(
            conversation, chat_template=chat_template, add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message, tools=tools, tokenize=True, return_dict=False,
            **(chat_template_kwargs or {}))} for conversation in conversations]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm, lora_request=lora_request)

    def beam_search(self, prompts: Sequence[PromptType], params: BeamSearchParams,
                    lora_request: Any = None, use_tqdm: bool = False) -> list[BeamSearchOutput]:
        """Beam search for each prompt; each output holds beam_width sequences, the best first."""
        token_lists = []
        for prompt in prompts:
            parsed = parse_prompt(prompt)
            token_lists.append(parsed.token_ids if parsed.token_ids is not None
                               else self.get_tokenizer().encode(parsed.text))
        step_params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=2 * params.beam_width,
                                     ignore_eos=True, detokenize=False)
        if params.temperature > 0:
            temperature = params.temperature
            step_params.logits_processors = [lambda output_ids, logits: logits / temperature]

        def expand(beams: list[list[int]]) -> list[dict[int, Logprob]]:
            outputs = self.generate([{"prompt_token_ids": tokens} for tokens in beams], step_params,
                                    use_tqdm=use_tqdm, lora_request=lora_request)
            return [output.outputs[0].logprobs[0] for output in outputs]

        engine = self.llm_engine
        eos_ids = ({engine.eos_token_id} | engine.generation_eos_ids()) - {None}
        tokenizer = engine.tokenizer
        decode = tokenizer.decode if tokenizer is not None else None
        return beam_search(token_lists, params, expand, eos_ids, decode)

    def _run_engine(self, request_ids: list[str], use_tqdm: Union[bool, Callable[..., Any]]) -> list[Any]:
        finished: dict[str, Any] = {}
        bar = _progress_bar(len(request_ids), use_tqdm) if use_tqdm else None
        prompt_tokens = output_tokens = 0
        while self.llm_engine.has_unfinished_requests():
            for output in self.llm_engine.step():
                if not output.finished:
                    continue
                finished[output.request_id] = output
                if bar is not None:
                    prompt_tokens += len(output.prompt_token_ids or [])
                    if isinstance(output, RequestOutput):
                        output_tokens += sum(len(c.token_ids) for c in output.outputs)
                    elapsed = bar.format_dict["elapsed"] or 1e-9
                    bar.postfix = (f"est. speed input: {prompt_tokens / elapsed:.2f} toks/s, "
                                   f"output: {output_tokens / elapsed:.2f} toks/s")
                    bar.update(1)
        if bar is not None:
            bar.close()
        return [finished[request_id] for request_id in request_ids if request_id in finished]

    def start_profile(self) -> None:
        """Start the torch profiler (traces go to VLLM_TORCH_PROFILER_DIR or PAGEDLLM_TORCH_PROFILER_DIR)."""
        self.llm_engine.start_profile()

    def stop_profile(self) -> None:
        self.llm_engine.stop_profile()

    def reset_prefix_cache(self) -> bool:
        return self.llm_engine.reset_prefix_cache()

    def sleep(self, level: int = 1) -> None:
        """Release the weights (level 1 keeps a host copy, level 2 none) and the KV cache
        (needs enable_sleep_mode=True); `wake_up()` restores them."""
        self.llm_engine.sleep(level)

    def wake_up(self, tags: Optional[list[str]] = None) -> None:
        """Restore what sleep() released: "weights", "kv_cache", or both when `tags` is None."""
        self.llm_engine.wake_up(tags)

    def is_sleeping(self) -> bool:
        return self.llm_engine.is_sleeping()

    def collective_rpc(self, method: Any, timeout: Optional[float] = None, args: tuple = (),
                       kwargs: Optional[dict[str, Any]] = None) -> list[Any]:
        return self.llm_engine.collective_rpc(method, timeout, args, kwargs)

    # LoRA adapters (LLMEngine's calls; requests name theirs with `lora_request`).
    def add_lora(self, lora_request: LoRARequest) -> bool:
        return self.llm_engine.add_lora(lora_request)

    def remove_lora(self, lora_id: int) -> bool:
        return self.llm_engine.remove_lora(lora_id)

    def list_loras(self) -> set[int]:
        return self.llm_engine.list_loras()

    def pin_lora(self, lora_id: int) -> bool:
        return self.llm_engine.pin_lora(lora_id)


def _call_on_model(func: Callable[[Any], _R], worker: Any) -> _R:
    return func(worker.model_runner.model)


def _progress_bar(total: int, use_tqdm: Union[bool, Callable[..., Any]]) -> Any:
    """vLLM's progress bar; `use_tqdm` may be a tqdm-like callable (e.g. `functools.partial(tqdm, leave=False)`)."""
    from tqdm.auto import tqdm

    bar = use_tqdm if callable(use_tqdm) else tqdm
    return bar(total=total, desc="Processed prompts", dynamic_ncols=True,
               postfix="est. speed input: 0.00 toks/s, output: 0.00 toks/s")
