"""Greedy output on the real default model is the same whatever the scheduling and KV cache settings.

Each configuration is one engine, built once; the reference is the shared default engine (prefix caching
on, no chunked prefill, FCFS, recompute, a cache large enough for everything). Every
configuration must also show that its feature was exercised (chunks, hits, preemptions, swaps).
"""
from __future__ import annotations

from typing import Any, NamedTuple

import pytest

from pagedllm import LLM, SamplingParams, TokensPrompt

PASSAGE = (
    "The lighthouse keeper kept a log of every ship that passed the point. In spring the fishing boats went "
    "out before dawn and came back heavy in the afternoon, gulls circling over their decks. In summer the "
    "ferries ran twice a day to the islands, carrying tourists, bicycles, crates of vegetables and the post. "
    "Autumn brought the storms: grey water piled against the rocks, spray reached the lamp room, and the "
    "keeper climbed the stairs every two hours to trim the wick and wipe the glass. Winter was quiet. He "
    "read, repaired nets for the village, and wrote letters to his sister in the city, describing the colour "
    "of the sea each morning, which was never the same twice. One January night a cargo ship lost power "
    "near the reef. He saw its lights drifting, rang the bell, and signalled to the coast guard with the "
    "lamp, long and short flashes, until the tug arrived. The captain visited in March with a bottle of "
    "wine and a photograph of the crew. The keeper pinned it above his desk, beside the tide tables, the "
    "barometer readings and a map of the coast drawn by his grandfather, who had kept the same light for "
    "forty years before him and had taught him how to read the weather from the shape of the clouds. "
    "When the new automatic lamp was installed, the engineers asked whether he would miss the work. He said "
    "that the light had never been the work; the watching was. He moved to a cottage above the harbour, "
    "where he could still see the tower from his kitchen window. Each evening he checked that the beam "
    "turned on at dusk, counted its flashes against his watch, and noted the time in a new log, although "
    "nobody asked him to. The children of the village came to hear his stories about shipwrecks, seals on "
    "the rocks, the winter the bay froze, and the summer a whale followed the ferry for a week. When he "
    "died, the village hung his old brass lamp in the harbour office, and the harbour master still lights "
    "it on the first night of every winter, for the keeper and for everyone who is out at sea.")
# (start, length) slices of the passage: 40 to 300 tokens, several sharing a prefix.
SLICES = [(0, 40), (0, 150), (0, 300), (10, 75), (60, 203), (120, 260)]
MAX_TOKENS = 24
TINY_CACHE = 32  # blocks of 16 tokens: fewer than the requests need together, so some are preempted
SMALL_CACHE_BYTES = 1 << 28

CONFIGS: dict[str, dict[str, Any]] = {
    "chunked_prefill_32": dict(enable_chunked_prefill=True, max_num_batched_tokens=32, max_num_seqs=32,
                               enable_prefix_caching=False, kv_cache_memory=SMALL_CACHE_BYTES),
    "no_prefix_caching": dict(enable_prefix_caching=False, kv_cache_memory=SMALL_CACHE_BYTES),
    "tiny_cache_recompute": dict(num_gpu_blocks_override=TINY_CACHE, enable_prefix_caching=False),
    "tiny_cache_swap": dict(num_gpu_blocks_override=TINY_CACHE, preemption_mode="swap", swap_space=0.05,
                            enable_prefix_caching=False),
    "chunked_prefix_tiny": dict(enable_chunked_prefill=True, max_num_batched_tokens=32, max_num_seqs=32,
                                enable_prefix_caching=True, num_gpu_blocks_override=TINY_CACHE),
    "priority": dict(scheduling_policy="priority", num_gpu_blocks_override=TINY_CACHE),
}


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[TokensPrompt]:
    ids = tokenizer.encode(PASSAGE)
    assert len(ids) >= 380
    return [TokensPrompt(prompt_token_ids=ids[start:start + length]) for start, length in SLICES]


def generate(llm: LLM, prompts: list[TokensPrompt], priority: Any = None) -> list[Any]:
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    return llm.generate(prompts, params, use_tqdm=False, priority=priority)


@pytest.fixture(scope="module")
def reference(llm, prompts) -> list[list[int]]:
    return [list(o.outputs[0].token_ids) for o in generate(llm, prompts)]


class Step(NamedTuple):
    """What one planned step did, noted when it was planned (requests change afterwards)."""

    request_ids: list[str]
    num_tokens: int
    partial_prefill: bool  # a prompt chunk that leaves more of the prompt for later steps
    swapped_out: bool
    swapped_in: bool


def record_steps(llm: LLM) -> list[Step]:
    """A Step for every SchedulerOutput the engine plans from now on."""
    scheduler, steps = llm.llm_engine.scheduler, []
    plan = scheduler.schedule

    def schedule() -> Any:
        out = plan()
        scheduled = [(scheduler.requests[rid], n) for rid, n in out.num_scheduled_tokens.items()]
        steps.append(Step(list(out.num_scheduled_tokens), out.num_batched_tokens,
                          any(n > 1 and r.num_computed_tokens + n < r.num_prompt_tokens for r, n in scheduled),
                          bool(out.blocks_to_swap_out), bool(out.blocks_to_swap_in)))
        return out

    scheduler.schedule = schedule
    return steps


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_output_is_identical_across_configurations(name, prompts, reference):
    llm = LLM(**CONFIGS[name])
    steps = record_steps(llm)
    priority = list(range(len(prompts), 0, -1)) if name == "priority" else None
    outputs = generate(llm, prompts, priority)
    assert [list(o.outputs[0].token_ids) for o in outputs] == reference
    scheduler = llm.llm_engine.scheduler
    cached = [o.num_cached_tokens for o in outputs]
    if "chunked" in name:
        assert max(s.num_tokens for s in steps) == 32 and any(s.partial_prefill for s in steps)
    if CONFIGS[name].get("enable_prefix_caching", True):
        assert sum(cached) >= 2 * 32  # the slices starting at 0 share their first blocks
    else:
        assert cached == [0] * len(prompts)
    if "tiny" in name or name == "priority":
        assert scheduler.num_preemptions > 0
    if "swap" in name:
        assert any(s.swapped_out for s in steps) and any(s.swapped_in for s in steps)
    if name == "priority":
        assert steps[0].request_ids[0] == outputs[-1].request_id  # the last prompt has the best priority
    assert scheduler.kv_cache.num_free_blocks == scheduler.kv_cache.num_blocks


@pytest.mark.slow
def test_a_repeated_prompt_reports_its_cached_full_blocks(llm, tokenizer):
    prompt = TokensPrompt(prompt_token_ids=tokenizer.encode(PASSAGE)[205:408])  # in no other test
    first, second = generate(llm, [prompt]), generate(llm, [prompt])
    prompt_len = len(prompt["prompt_token_ids"])
    assert first[0].num_cached_tokens == 0
    assert second[0].num_cached_tokens == (prompt_len // 16) * 16
    assert second[0].outputs[0].token_ids == first[0].outputs[0].token_ids
    assert llm.reset_prefix_cache()
    assert generate(llm, [prompt])[0].num_cached_tokens == 0
