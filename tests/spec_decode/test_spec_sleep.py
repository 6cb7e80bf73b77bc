"""Sleep mode with speculative decoding: after sleep (level 1 or 2) and wake_up(), prompt lookup and the int8
self-draft give the same greedy output as before sleeping, still speculating; while asleep the draft's weights
are released as the target's are."""
from __future__ import annotations

import pytest

from pagedllm import LLM, SamplingParams

pytestmark = pytest.mark.slow

PROMPTS = [
    "Repeat the following text exactly, without changes:\n\nThe meeting is moved to Thursday at ten. Please "
    "bring the quarterly report and the list of open tickets.",
    "Return this code unchanged:\n\ndef add(a, b):\n    return a + b\n",
]
GREEDY = SamplingParams(temperature=0, max_tokens=24)
CONFIGS = {
    "ngram": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1},
    "int8-self-draft": {"method": "draft_model", "quantization": "int8", "num_speculative_tokens": 3},
}


@pytest.fixture(scope="module", params=list(CONFIGS))
def sleepy_spec_llm(request):
    llm = LLM(speculative_config=CONFIGS[request.param], enable_sleep_mode=True, num_gpu_blocks_override=64)
    yield llm
    llm.llm_engine.model_executor.shutdown()


def _tokens_and_drafts(llm: LLM) -> tuple[list[list[int]], int]:
    """The greedy outputs and how many proposed tokens were verified while producing them."""
    before = llm.llm_engine.stats.spec_decode.draft_tokens
    outputs = llm.chat([[{"role": "user", "content": p}] for p in PROMPTS], GREEDY, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outputs], llm.llm_engine.stats.spec_decode.draft_tokens - before


def _draft_weight_bytes(llm: LLM) -> int:
    """Bytes the draft model's tensors hold now (0 for prompt lookup, which has no model)."""
    from pagedllm.worker.sleep import model_tensors

    draft = getattr(llm.llm_engine.model_executor.worker.model_runner.proposer, "model", None)
    return 0 if draft is None else sum(t.untyped_storage().nbytes() for t in model_tensors(draft))


@pytest.mark.parametrize("level", [1, 2])
def test_greedy_output_after_waking_equals_before(sleepy_spec_llm, level):
    before, drafts = _tokens_and_drafts(sleepy_spec_llm)
    assert drafts > 0
    draft_bytes = _draft_weight_bytes(sleepy_spec_llm)
    sleepy_spec_llm.sleep(level=level)
    if draft_bytes:
        assert _draft_weight_bytes(sleepy_spec_llm) < draft_bytes / 100  # released, not merely unused
    sleepy_spec_llm.wake_up()
    after, drafts = _tokens_and_drafts(sleepy_spec_llm)
    assert after == before
    assert drafts > 0  # the draft (or lookup) still proposes after waking
    assert _draft_weight_bytes(sleepy_spec_llm) == draft_bytes


def test_waking_the_cache_before_the_weights(sleepy_spec_llm):
    before, _ = _tokens_and_drafts(sleepy_spec_llm)
    sleepy_spec_llm.sleep(level=2)
    sleepy_spec_llm.wake_up(tags=["kv_cache"])
    sleepy_spec_llm.wake_up(tags=["weights"])
    assert _tokens_and_drafts(sleepy_spec_llm)[0] == before
