"""Speculative decoding's counts, exact: the Prometheus counters and gauges, each request's acceptance counts
and the periodic log line, against a replay of the proposals and acceptances from the outputs themselves."""
from __future__ import annotations

import logging

import pytest
from prometheus_client import REGISTRY

from pagedllm import LLM, SamplingParams
from pagedllm.metrics import LoggingStatLogger
from pagedllm.spec_decode.ngram import lookup

K, MAX_TOKENS = 3, 24
NAME = "tiny-spec"


def replay(prompt: list[int], output: list[int]) -> tuple[int, int, int, list[int]]:
    """(proposed, accepted, emitted, acceptance counts) of greedy prompt lookup producing `output`: the first
    token comes from the prefill; each later step verifies the lookup's proposals (trimmed to what max_tokens
    leaves) and emits the matching ones plus one."""
    proposed = accepted = emitted = 0
    counts = [0] * (K + 1)
    n = 1
    while n < len(output):
        proposal = lookup(prompt + output[:n], K, 1, 4)[:MAX_TOKENS - n - 1]
        kept = 0
        while kept < len(proposal) and proposal[kept] == output[n + kept]:
            kept += 1
        if proposal:
            proposed, accepted, emitted = proposed + len(proposal), accepted + kept, emitted + kept + 1
            for i in range(kept + 1):
                counts[i] += 1
        n += kept + 1
    return proposed, accepted, emitted, counts


def value(name: str) -> float:
    return REGISTRY.get_sample_value(name, {"model_name": NAME})


def test_spec_decode_counts_are_exact(tiny_model_dir, caplog):
    llm = LLM(tiny_model_dir, speculative_config={"method": "ngram", "num_speculative_tokens": K},
              disable_log_stats=False, served_model_name=NAME)
    engine = llm.llm_engine
    stat_logger = LoggingStatLogger(local_interval=3600.0)
    engine.add_logger("test-line", stat_logger)
    prompts = [[200, 201, 202, 203] * 6, [300, 301, 302, 303, 304] * 4 + [200]]
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts],
                           SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True), use_tqdm=False)
    replays = [replay(p, o.outputs[0].token_ids) for p, o in zip(prompts, outputs)]
    proposed, accepted, emitted = (sum(r[i] for r in replays) for i in range(3))
    assert proposed > 0
    assert [o.metrics.spec_token_acceptance_counts for o in outputs] == [r[3] for r in replays]
    assert value("vllm:spec_decode_num_draft_tokens_total") == proposed
    assert value("vllm:spec_decode_num_accepted_tokens_total") == accepted
    assert value("vllm:spec_decode_num_emitted_tokens_total") == emitted
    assert value("vllm:spec_decode_draft_acceptance_rate") == pytest.approx(accepted / proposed)
    num_verifying_steps = sum(r[3][0] for r in replays)
    assert value("vllm:spec_decode_efficiency") == pytest.approx(emitted / (proposed + num_verifying_steps))
    caplog.set_level(logging.INFO, logger="pagedllm.metrics.loggers")
    stat_logger.local_interval = 0.0
    engine.do_log_stats()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Speculative metrics")]
    assert lines == [f"Speculative metrics: Draft acceptance rate: {accepted / proposed:.3f}, System efficiency: "
                     f"{emitted / (proposed + num_verifying_steps):.3f}, Number of speculative tokens: {K}, Number "
                     f"of accepted tokens: {accepted}, Number of draft tokens: {proposed}, Number of emitted "
                     f"tokens: {emitted}."]
