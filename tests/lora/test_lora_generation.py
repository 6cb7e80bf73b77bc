"""LoRA adapters applied by the engine against transformers + peft on the same adapter, and against
themselves: several adapters and the base model in one batch, eviction under one slot, tensor parallelism."""
from __future__ import annotations

import pytest
import torch

from pagedllm import LLM, LoRARequest, SamplingParams

pytestmark = pytest.mark.slow

NUM_TOKENS = 16
TIE_MARGIN = 0.05  # a token other than the reference's argmax only where the reference is this close to a tie
LOGPROB_TOLERANCE = 2e-3
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a land far away,"]
GREEDY = SamplingParams(temperature=0, max_tokens=NUM_TOKENS, ignore_eos=True, logprobs=1)


def lora(adapters: list[str], index: int) -> LoRARequest:
    return LoRARequest(f"adapter{index}", index + 1, adapters[index])


def tokens(outputs) -> list[list[int]]:
    return [list(output.outputs[0].token_ids) for output in outputs]


@pytest.fixture(scope="module")
def prompt_ids(tokenizer) -> list[list[int]]:
    return [tokenizer.encode(p) for p in PROMPTS]


def test_greedy_tokens_and_logprobs_equal_transformers_with_peft(lora_llm, make_adapter, prompt_ids, tmp_path):
    peft_model = make_adapter(tmp_path / "ref", seed=7, rank=16, use_rslora=True)
    request = LoRARequest("ref", 99, str(tmp_path / "ref"))
    ours = lora_llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], GREEDY, use_tqdm=False,
                             lora_request=request)
    base = lora_llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], GREEDY, use_tqdm=False)
    assert tokens(ours) != tokens(base)  # the adapter changes what the model says
    for ids, output in zip(prompt_ids, ours):
        completion = output.outputs[0]
        with torch.no_grad():
            logits = peft_model(torch.tensor([ids + list(completion.token_ids)])).logits[0, len(ids) - 1:-1]
        reference = torch.log_softmax(logits.float(), dim=-1)  # [NUM_TOKENS, vocab], teacher-forced on ours
        chosen = reference[torch.arange(NUM_TOKENS), torch.tensor(completion.token_ids)]
        gaps = reference.max(dim=-1).values - chosen
        assert (gaps < TIE_MARGIN).all(), gaps
        got = torch.tensor([step[t].logprob for step, t in zip(completion.logprobs, completion.token_ids)])
        assert torch.allclose(got, chosen, rtol=0, atol=LOGPROB_TOLERANCE), (got - chosen).abs().max()
    lora_llm.remove_lora(99)


def test_mixed_batch_equals_each_request_alone(lora_llm, adapters, prompt_ids):
    requests = [lora(adapters, 0), lora(adapters, 1), lora(adapters, 2), None]
    prompts = [{"prompt_token_ids": prompt_ids[i % len(prompt_ids)]} for i in range(len(requests))]
    mixed = tokens(lora_llm.generate(prompts, GREEDY, use_tqdm=False, lora_request=requests))
    alone = [tokens(lora_llm.generate([p], GREEDY, use_tqdm=False, lora_request=r))[0]
             for p, r in zip(prompts, requests)]
    assert mixed == alone
    assert mixed[0] != mixed[3]  # the same prompt with adapter 0 and with the base model


def test_four_adapters_under_one_slot_evict_and_reload_with_the_same_outputs(lora_llm, adapters, prompt_ids):
    requests = [lora(adapters, i) for i in range(4)] + [None]
    prompts = [{"prompt_token_ids": prompt_ids[0]}] * len(requests)
    expected = tokens(lora_llm.generate(prompts, GREEDY, use_tqdm=False, lora_request=requests))
    assert expected[0] != expected[4] and len({tuple(t) for t in expected}) >= 3  # the adapters change answers
    one_slot = LLM(enable_lora=True, max_loras=1, max_lora_rank=16)  # one slot, one adapter in host memory
    assert tokens(one_slot.generate(prompts, GREEDY, use_tqdm=False, lora_request=requests)) == expected
    assert one_slot.list_loras() == {4}
    again = [requests[1], requests[0]]  # evicted from the slot and the host cache: read again from disk
    assert tokens(one_slot.generate(prompts[:2], GREEDY, use_tqdm=False, lora_request=again)) == \
        [expected[1], expected[0]]


def test_tensor_parallel_mp_gives_the_uniproc_tokens(lora_llm, adapters, prompt_ids):
    requests = [lora(adapters, 1), lora(adapters, 2), None]
    prompts = [{"prompt_token_ids": ids} for ids in prompt_ids]
    expected = tokens(lora_llm.generate(prompts, GREEDY, use_tqdm=False, lora_request=requests))
    sharded = LLM(enable_lora=True, max_loras=2, max_lora_rank=16, tensor_parallel_size=3,
                  distributed_executor_backend="mp")
    try:
        assert tokens(sharded.generate(prompts, GREEDY, use_tqdm=False, lora_request=requests)) == expected
        assert sharded.list_loras() == {2, 3}
    finally:
        del sharded


def test_cpu_graphs_replay_lora_steps_as_eager(lora_llm, adapters, prompt_ids):
    requests = [lora(adapters, 0), None, lora(adapters, 3)]
    prompts = [{"prompt_token_ids": ids} for ids in prompt_ids]
    replayed = tokens(lora_llm.generate(prompts, GREEDY, use_tqdm=False, lora_request=requests))
    runner = lora_llm.llm_engine.model_executor.worker.model_runner
    assert runner.lora_decode_graphs.run_plan is not None and 3 in runner.lora_decode_graphs.graphs
    eager = LLM(enable_lora=True, max_loras=4, max_lora_rank=16, enforce_eager=True)
    assert tokens(eager.generate(prompts, GREEDY, use_tqdm=False, lora_request=requests)) == replayed
