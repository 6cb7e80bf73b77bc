"""A request that fails on its own while its batch runs fails alone: it ends with finish_reason "error" and
why, the other requests of the batch produce exactly the tokens they produce without it, and later requests
are served."""
from __future__ import annotations

import math

import pytest
import torch

from pagedllm import SamplingParams

pytestmark = pytest.mark.slow

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time,"]
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


def _raises_on_third_token(output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
    if len(output_ids) == 2:
        raise RuntimeError("this processor breaks on the third token")
    return logits


def _nan_on_second_token(output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
    return logits * math.nan if len(output_ids) == 1 else logits


def _masks_everything(output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
    return torch.full_like(logits, -math.inf)


def _bad_cases() -> dict:
    def with_processor(processor) -> SamplingParams:
        params = GREEDY.clone()
        params.logits_processors = [processor]
        return params

    return {
        "raising logits processor": (with_processor(_raises_on_third_token), "logits processor raised RuntimeError", 2),
        "NaN logits": (with_processor(_nan_on_second_token), "NaN or infinity", 1),
        "every token masked": (with_processor(_masks_everything), "leave no token to sample: logits_processors", 0),
        "seed torch refuses": (SamplingParams(temperature=0.8, seed=2 ** 64, max_tokens=8), "seed", 0),
    }


@pytest.fixture(scope="module")
def alone(llm) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


@pytest.mark.parametrize("case", list(_bad_cases()))
def test_a_failing_request_fails_alone_and_the_engine_goes_on(llm, alone, case, caplog):
    bad_params, says, num_tokens = _bad_cases()[case]
    prompts = PROMPTS[:1] + ["Tell me about the sea"] + PROMPTS[1:]
    with caplog.at_level("WARNING", logger="pagedllm.engine.llm_engine"):
        outputs = llm.generate(prompts, [GREEDY, bad_params, GREEDY, GREEDY], use_tqdm=False)
    bad = outputs[1].outputs[0]
    assert outputs[1].finished and bad.finish_reason == "error"
    assert says in bad.stop_reason and len(bad.token_ids) == num_tokens
    # Parameters that leave no token are the client's mistake: a warning, not an error, in the server's log.
    level = "WARNING" if "leave no token" in says else "ERROR"
    assert [r.levelname for r in caplog.records if "failed alone" in r.getMessage()] == [level]
    assert [o.outputs[0].token_ids for o in outputs[:1] + outputs[2:]] == alone
    assert all(o.outputs[0].finish_reason == "length" for o in outputs[:1] + outputs[2:])
    engine = llm.llm_engine
    assert not engine.has_unfinished_requests() and not engine.requests
    assert all(scheduler.kv_cache.num_free_blocks == scheduler.kv_cache.num_blocks for scheduler in engine.schedulers)
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)] == alone


def test_one_failing_sample_of_an_n_request_fails_it_alone(llm, alone):
    params = SamplingParams(n=2, temperature=0.8, seed=2 ** 64 - 1, max_tokens=4)  # the second sample's seed overflows
    outputs = llm.generate(PROMPTS[:2], [GREEDY, params], use_tqdm=False)
    reasons = sorted(c.finish_reason for c in outputs[1].outputs)
    assert reasons == ["error", "length"] and outputs[1].finished
    assert outputs[0].outputs[0].token_ids == alone[0]
