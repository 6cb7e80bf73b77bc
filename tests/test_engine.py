"""Engine mechanics on the real default model: batching invariance, preemption by recompute, abort."""
from __future__ import annotations

import logging

import pytest

from pagedllm import LLM, SamplingParams
from pagedllm.sampling_params import GuidedDecodingParams

pytestmark = pytest.mark.slow

TARGET = "The history of paged memory in operating systems begins"
OTHERS = [f"Item {i}: " + " ".join(["a short note about the weather"] * (1 + i % 6)) for i in range(32)]
PREEMPTION_PROMPTS = ["The first law of robotics says", "Three reasons to learn Python are",
                      "My favourite recipe for pancakes", "In the year 2050, cities will",
                      "A haiku about the sea:", "The quick brown fox"]


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)


@pytest.fixture(scope="module")
def small_llm():
    """The default model with a KV cache far too small for its batch: 12 blocks of 16 tokens."""
    return LLM(num_gpu_blocks_override=12)


def test_same_greedy_output_alone_and_in_a_batch_of_32_others(llm):
    alone = llm.generate(TARGET, greedy(16), use_tqdm=False)[0].outputs[0].token_ids
    # The others have different lengths and stop at different steps, so the batch changes shape as it runs.
    prompts = OTHERS[:16] + [TARGET] + OTHERS[16:]
    params = [greedy(2 + i % 11) for i in range(16)] + [greedy(16)] + [greedy(2 + i % 7) for i in range(16)]
    batch = llm.generate(prompts, params, use_tqdm=False)
    assert len(batch) == 33
    assert batch[16].outputs[0].token_ids == alone
    assert [len(o.outputs[0].token_ids) for o in batch] == [p.max_tokens for p in params]


def test_same_output_when_a_tiny_kv_cache_forces_preemption(llm, small_llm):
    expected = [o.outputs[0].token_ids for o in llm.generate(PREEMPTION_PROMPTS, greedy(24), use_tqdm=False)]
    scheduler = small_llm.llm_engine.scheduler
    before = scheduler.num_preemptions
    got = [o.outputs[0].token_ids for o in small_llm.generate(PREEMPTION_PROMPTS, greedy(24), use_tqdm=False)]
    assert scheduler.num_preemptions > before
    assert got == expected
    assert scheduler.kv_cache.num_free_blocks == scheduler.kv_cache.num_blocks


def test_a_prompt_that_can_never_fit_finishes_empty_with_length_and_the_rest_go_on(small_llm, tokenizer, caplog):
    too_long = {"prompt_token_ids": tokenizer.encode("word " * 200)}
    assert len(too_long["prompt_token_ids"]) > 12 * 16
    with caplog.at_level(logging.WARNING, logger="pagedllm"):
        outputs = small_llm.generate(["Hello, my name is", too_long, "The sun is"], greedy(5), use_tqdm=False)
    ignored = outputs[1].outputs[0]
    assert outputs[1].finished and ignored.finish_reason == "length"
    assert ignored.text == "" and ignored.token_ids == []
    assert [len(outputs[i].outputs[0].token_ids) for i in (0, 2)] == [5, 5]
    assert str(len(too_long["prompt_token_ids"])) in caplog.text


def test_abort_frees_every_block_of_running_and_waiting_requests(llm):
    engine = llm.llm_engine
    kv_cache = engine.scheduler.kv_cache
    assert kv_cache.num_free_blocks == kv_cache.num_blocks
    engine.add_request("abort-running", "Tell me a long story about a dragon", greedy(8))
    engine.add_request("abort-kept", "Count from one to twenty:", greedy(8))
    engine.step()
    engine.add_request("abort-waiting", "This request never gets to run", greedy(8))
    engine.abort_request(["abort-running", "abort-waiting", "no-such-request"])
    kept = engine.scheduler.requests["abort-kept"]
    assert kv_cache.num_free_blocks == kv_cache.num_blocks - len(kept.block_ids)
    assert engine.get_num_unfinished_requests() == 1
    outputs = []
    while engine.has_unfinished_requests():
        outputs.extend(engine.step())
    assert {o.request_id for o in outputs} == {"abort-kept"}
    assert outputs[-1].finished and len(outputs[-1].outputs[0].token_ids) == 8
    assert kv_cache.num_free_blocks == kv_cache.num_blocks


def test_abort_after_preemption_frees_every_block(small_llm):
    engine = small_llm.llm_engine
    scheduler = engine.scheduler
    before = scheduler.num_preemptions
    ids = [f"preempted-{i}" for i in range(len(PREEMPTION_PROMPTS))]
    for request_id, prompt in zip(ids, PREEMPTION_PROMPTS):
        engine.add_request(request_id, prompt, greedy(40))
    while scheduler.num_preemptions == before:
        engine.step()
    assert any(scheduler.requests[i].status.name == "PREEMPTED" for i in ids if i in scheduler.requests)
    engine.abort_request(ids[0])
    engine.step()  # the others carry on
    engine.abort_request(ids)
    assert not engine.has_unfinished_requests()
    assert scheduler.kv_cache.num_free_blocks == scheduler.kv_cache.num_blocks


def test_no_per_request_state_outlives_its_requests(llm):
    """Finished, stopped, aborted, n > 1 and guided requests leave no record in the engine, scheduler, KV
    cache manager or worker: a long-running server's memory does not grow with the requests it served."""
    engine = llm.llm_engine
    scheduler, worker = engine.scheduler, engine.model_executor.worker
    guided = GuidedDecodingParams(choice=["yes", "no"])
    engine.add_request("state-n2", "Name a colour:", SamplingParams(n=2, seed=1, max_tokens=4))
    engine.add_request("state-stop", "Count: one, two,", SamplingParams(max_tokens=8, stop=[","], temperature=0))
    engine.add_request("state-guided", "Yes or no?", SamplingParams(max_tokens=4, guided_decoding=guided))
    engine.add_request("state-aborted", "Tell me a long story", greedy(16))
    engine.step()
    engine.abort_request("state-aborted")
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.requests == {} and engine.parents == {} and scheduler.requests == {}
    assert scheduler.kv_cache._num_hashed == {} and scheduler.kv_cache.swapped_block_ids == {}
    engine.add_request("state-next", "Hello", greedy(2))  # its first step tells the worker what finished
    while engine.has_unfinished_requests():
        engine.step()
    runner = worker.model_runner
    assert not [rid for rid in runner.input_state.requests if "state-" in rid and "state-next" not in rid]
    assert not [rid for rid in runner.generators if "state-" in rid and "state-next" not in rid]


def test_a_request_id_can_be_reused_once_its_request_finished(llm):
    """The scheduler reports a finished id to the next step; a new request that reuses it in between is a new
    request (it once finished at once, empty, as if it could never fit)."""
    engine = llm.llm_engine
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    finished = []
    for _ in range(3):
        engine.add_request("reused-id", "Hello there", params)
        while engine.has_unfinished_requests():
            finished += [o for o in engine.step() if o.finished]
    assert [o.request_id for o in finished] == ["reused-id"] * 3
    assert all(o.outputs[0].finish_reason == "length" for o in finished)
    assert finished[0].outputs[0].token_ids == finished[1].outputs[0].token_ids == finished[2].outputs[0].token_ids
    assert len(finished[0].outputs[0].token_ids) == 4
