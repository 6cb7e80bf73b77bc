"""On a GPU, a decode step waits for the device once: to bring its sampled tokens to the host. The step's
inputs and sampling parameters go to the device without waiting for the work queued before them, and each
row's largest logit, which tells whether the row could be sampled, is copied without waiting, before the
tokens. Skipped without CUDA."""
from __future__ import annotations

import warnings

import pytest
import torch

from pagedllm import LLM, SamplingParams

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("enforce_eager", [False, True], ids=["graphs", "eager"])
def test_a_decode_step_synchronises_once(default_model, enforce_eager):
    llm = LLM(default_model, device="cuda", num_gpu_blocks_override=256, enforce_eager=enforce_eager)
    engine = llm.llm_engine
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    for i in range(3):
        engine.add_request(str(i), {"prompt_token_ids": list(range(10 + i, 40))}, params)
    engine.step()  # the prefills
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            outputs = engine.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert [len(o.outputs[0].token_ids) for o in outputs] == [2, 2, 2]
    syncs = [str(w.message) for w in caught if "synchroniz" in str(w.message)]
    assert len(syncs) == 1, syncs
