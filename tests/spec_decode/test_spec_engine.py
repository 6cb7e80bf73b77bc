"""Speculative decoding on the default model: greedy outputs (tokens and top logprobs) equal plain decoding's
for prompt lookup and the int8 self-draft, with prefix caching, under preemption, with stops in the middle of
an accepted run; sampled requests stay reproducible; guided requests speculate and decode as plain guided
decoding does."""
from __future__ import annotations

import math

import pytest
import torch

from pagedllm import LLM, SamplingParams
from pagedllm.sampling_params import GuidedDecodingParams

pytestmark = pytest.mark.slow

PROMPTS = [
    "Repeat the following text exactly, without changes:\n\nThe meeting is moved to Thursday at ten. Please "
    "bring the quarterly report and the list of open tickets.",
    "Repeat the following list exactly:\n\n1. Open the door.\n2. Turn on the light.\n3. Close the window.\n",
]
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1}
INT8 = {"method": "draft_model", "quantization": "int8", "num_speculative_tokens": 3}


def chat(llm: LLM, params: SamplingParams, prompts: list[str] = PROMPTS):
    return llm.chat([[{"role": "user", "content": p}] for p in prompts], params, use_tqdm=False)


def assert_same_as_plain(spec_outputs, plain_outputs) -> None:
    for spec, plain in zip(spec_outputs, plain_outputs):
        a, b = spec.outputs[0], plain.outputs[0]
        assert a.token_ids == b.token_ids and a.text == b.text and a.finish_reason == b.finish_reason
        if b.logprobs is not None:
            for got, want in zip(a.logprobs, b.logprobs):
                assert list(got) == list(want)  # same top tokens, in the same order
                # (a grammar's mask leaves -inf logprobs in the top ones: equal, not close)
                assert all(math.isclose(got[t].logprob, want[t].logprob, abs_tol=1e-3) for t in want)


@pytest.fixture(scope="module")
def ngram_llm():
    return LLM(speculative_config=NGRAM)


@pytest.fixture(scope="module")
def int8_llm():
    return LLM(speculative_config=INT8)


@pytest.fixture(scope="module")
def greedy_plain(llm):
    return chat(llm, SamplingParams(max_tokens=40, temperature=0, logprobs=3))


@pytest.mark.parametrize("config", [NGRAM, INT8], ids=["ngram", "int8-self-draft"])
def test_greedy_outputs_equal_plain_decoding(request, config, greedy_plain):
    spec_llm = request.getfixturevalue("ngram_llm" if config is NGRAM else "int8_llm")
    outputs = chat(spec_llm, SamplingParams(max_tokens=40, temperature=0, logprobs=3))
    assert_same_as_plain(outputs, greedy_plain)
    counts = [o.metrics.spec_token_acceptance_counts for o in outputs]
    assert all(c is not None and c[1] > 0 for c in counts)  # proposals were verified and some kept
    runner = spec_llm.llm_engine.model_executor.worker.model_runner
    if config is INT8:  # the self-draft reads and writes the target's own KV cache: no prefill, no second cache
        assert runner.proposer.kv_caches is runner.kv_caches[0] and runner.proposer.block_bytes() == 0
    # A second round finds the prompts in the prefix cache and still decodes the same.
    again = chat(spec_llm, SamplingParams(max_tokens=40, temperature=0, logprobs=3))
    assert all(o.num_cached_tokens > 0 for o in again)
    assert_same_as_plain(again, greedy_plain)
    # Without logprobs, verification steps take the argmax of every position from their CPU graph's greedy step.
    greedy = chat(spec_llm, SamplingParams(max_tokens=40, temperature=0))
    assert [o.outputs[0].token_ids for o in greedy] == [o.outputs[0].token_ids for o in greedy_plain]
    graphs = runner.decode_graphs.graphs
    assert any(rows > len(PROMPTS) and graph._greedy_steps is not None for rows, graph in graphs.items())


def test_stops_inside_an_accepted_run_cut_there(ngram_llm, llm, greedy_plain):
    text = greedy_plain[0].outputs[0].text
    stop = text[len(text) // 2:len(text) // 2 + 3]
    cases = (SamplingParams(max_tokens=40, temperature=0, stop=[stop]),
             SamplingParams(max_tokens=13, temperature=0, logprobs=1),
             SamplingParams(max_tokens=40, temperature=0, stop=[stop], include_stop_str_in_output=True))
    params = [p for p in cases for _ in PROMPTS]  # every case on every prompt, in one batch
    assert_same_as_plain(chat(ngram_llm, params, PROMPTS * len(cases)), chat(llm, params, PROMPTS * len(cases)))


def test_under_preemption_outputs_equal_plain_decoding(llm):
    spec_llm = LLM(speculative_config=NGRAM, num_gpu_blocks_override=12, block_size=16, max_num_seqs=4)
    prompts = PROMPTS * 2
    params = SamplingParams(max_tokens=60, temperature=0)
    outputs = chat(spec_llm, params, prompts)
    assert spec_llm.llm_engine.scheduler.num_preemptions > 0
    assert_same_as_plain(outputs, chat(llm, params, prompts))


def test_seeded_sampling_is_reproducible_with_n_samples(ngram_llm):
    params = SamplingParams(max_tokens=24, temperature=0.7, seed=11, n=2)
    first, second = chat(ngram_llm, params), chat(ngram_llm, params)
    assert [[c.token_ids for c in o.outputs] for o in first] == [[c.token_ids for c in o.outputs] for o in second]
    assert all(len(o.outputs) == 2 for o in first)


FAIL_AT = 6  # the bad requests below fail at the position of their 7th token, inside a verified run


def _raises_at_the_failing_token(output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
    if len(output_ids) == FAIL_AT:
        raise RuntimeError("this processor breaks")
    return logits


def _masks_from_the_failing_token(output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
    return torch.full_like(logits, -math.inf) if len(output_ids) >= FAIL_AT else logits


def test_a_request_failing_at_a_verified_position_fails_there_alone(ngram_llm, llm, greedy_plain):
    """A position that cannot be sampled (a logits processor raised, every token masked) fails its request as
    plain decoding would at that token: the tokens before it kept, the reason given, the batch unchanged."""
    cases = [(_raises_at_the_failing_token, 0, "logits processor raised RuntimeError"),
             (_masks_from_the_failing_token, 0, "leave no token to sample: logits_processors"),
             (_masks_from_the_failing_token, 0.7, "leave no token to sample: logits_processors")]
    bad = [SamplingParams(max_tokens=40, temperature=temperature, seed=5, ignore_eos=True,
                          logits_processors=[processor]) for processor, temperature, _ in cases]
    good = SamplingParams(max_tokens=40, temperature=0, logprobs=3)
    outputs = chat(ngram_llm, [good, *bad, good], PROMPTS[:1] + PROMPTS[:1] * len(bad) + PROMPTS[1:])
    assert_same_as_plain(outputs[:1] + outputs[-1:], greedy_plain)
    plain_bad = chat(llm, bad[:2], PROMPTS[:1] * 2)
    for output, (_, _, says) in zip(outputs[1:-1], cases):
        failed = output.outputs[0]
        assert failed.finish_reason == "error" and says in failed.stop_reason
        assert len(failed.token_ids) == FAIL_AT
        assert output.metrics.spec_token_acceptance_counts[1] > 0  # it verified proposals before failing
    assert [o.outputs[0].token_ids for o in outputs[1:3]] == [o.outputs[0].token_ids for o in plain_bad]
    assert not ngram_llm.llm_engine.has_unfinished_requests()


RECORD_SCHEMA = {"type": "object", "required": ["name", "city", "tags"],
                 "properties": {"name": {"type": "string"}, "city": {"type": "string"},
                                "tags": {"type": "array", "items": {"type": "string"}}}}
GUIDED = [("Write this record as JSON: name Alice Smith, city Paris, tags red, green, blue.",
           GuidedDecodingParams(json=RECORD_SCHEMA)),
          ("Copy the phone number exactly: 555-123-4567.", GuidedDecodingParams(regex=r"[0-9]{3}-[0-9]{3}-[0-9]{4}")),
          (PROMPTS[0], GuidedDecodingParams(choice=["The meeting", "1. Open"]))]


@pytest.mark.parametrize("config", [NGRAM, INT8], ids=["ngram", "int8-self-draft"])
def test_guided_requests_speculate_and_decode_as_plain(request, config, llm):
    """Each verified position is masked by the grammar after the proposals before it: the greedy text is plain
    guided decoding's, and proposals were verified (and some kept) for every guided request."""
    spec_llm = request.getfixturevalue("ngram_llm" if config is NGRAM else "int8_llm")
    prompts = [prompt for prompt, _ in GUIDED]
    params = [SamplingParams(max_tokens=60, temperature=0, logprobs=2, guided_decoding=guided) for _, guided in GUIDED]
    outputs = chat(spec_llm, params, prompts)  # the grammars side by side in one batch
    assert_same_as_plain(outputs, chat(llm, params, prompts))
    for output in outputs:
        counts = output.metrics.spec_token_acceptance_counts
        assert counts is not None and counts[1] > 0


def test_a_draft_no_smaller_than_the_target_is_warned_of(int8_llm, tiny_model_dir, caplog):
    """The default model's linears stream as 4-bit blocks, fewer bytes than their int8 copies: its int8 self-draft
    draws the warning. A float32 model's int8 self-draft reads a quarter of its bytes and does not."""
    from pagedllm.model.layers import linear_weight_bytes
    from pagedllm.spec_decode.draft_model import warn_unless_cheaper

    runner = int8_llm.llm_engine.model_executor.worker.model_runner
    with caplog.at_level("WARNING", logger="pagedllm.spec_decode.draft_model"):
        warn_unless_cheaper(runner.proposer.model, runner.model)
    assert "likely slower than plain decoding" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="pagedllm.spec_decode.draft_model"):
        tiny_llm = LLM(tiny_model_dir, speculative_config=INT8)
    tiny = tiny_llm.llm_engine.model_executor.worker.model_runner
    assert 3 * linear_weight_bytes(tiny.proposer.model) < linear_weight_bytes(tiny.model)
    assert "likely slower" not in caplog.text
