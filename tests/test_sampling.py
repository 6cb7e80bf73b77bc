"""Every SamplingParams field on the real default model, each checked so that ignoring it would fail."""
from __future__ import annotations

import pytest
import torch

from pagedllm import SamplingParams
from pagedllm.sampling_params import RequestOutputKind

PROMPT = "The history of the city of Paris begins"
EOS_FIRST = "Write a short poem about the sea."  # the model answers this raw prompt with EOS at once


def generate(llm, prompt, **kwargs):
    return llm.generate(prompt, SamplingParams(**kwargs), use_tqdm=False)[0].outputs[0]


def recorder(with_prompt: bool):
    """A logits processor (of either signature) that keeps what it is called with and changes nothing."""
    calls: list[tuple] = []
    if with_prompt:
        def record(prompt_ids, output_ids, logits):
            calls.append((list(prompt_ids), list(output_ids), logits.clone()))
            return logits
    else:
        def record(output_ids, logits):
            calls.append((None, list(output_ids), logits.clone()))
            return logits
    return record, calls


@pytest.mark.slow
def test_seeded_sampling_reproduces_alone_and_in_a_batch(llm):
    params = SamplingParams(temperature=1.0, seed=1234, max_tokens=12, ignore_eos=True)
    alone = llm.generate(PROMPT, params, use_tqdm=False)[0].outputs[0].token_ids
    others = [SamplingParams(temperature=1.0, max_tokens=12), SamplingParams(temperature=0.7, seed=5, top_k=20),
              SamplingParams(temperature=0.0, max_tokens=5)]
    batch = llm.generate(["Once upon a time", PROMPT, "def main():", PROMPT],
                         [others[0], params, others[1], others[2]], use_tqdm=False)
    assert batch[1].outputs[0].token_ids == alone
    other_seed = generate(llm, PROMPT, temperature=1.0, seed=4321, max_tokens=12, ignore_eos=True).token_ids
    assert other_seed != alone


@pytest.mark.slow
def test_penalties_match_a_direct_computation_on_the_logits(llm):
    record, calls = recorder(with_prompt=True)
    presence, frequency, repetition = 0.6, 0.4, 1.5
    out = generate(llm, PROMPT, temperature=0.0, max_tokens=10, ignore_eos=True, logprobs=5,
                   presence_penalty=presence, frequency_penalty=frequency, repetition_penalty=repetition,
                   logits_processors=[record])
    assert len(calls) == len(out.token_ids) == 10
    changed = 0
    for (prompt_ids, output_ids, logits), token, reported in zip(calls, out.token_ids, out.logprobs):
        expected = logits.clone()
        seen = set(prompt_ids) | set(output_ids)
        for t in seen:
            expected[t] = expected[t] / repetition if expected[t] > 0 else expected[t] * repetition
        for t in set(output_ids):
            expected[t] -= presence + frequency * output_ids.count(t)
        expected = torch.log_softmax(expected, dim=-1)
        raw = torch.log_softmax(logits, dim=-1)
        assert token == int(expected.argmax())
        for t, logprob in reported.items():
            assert logprob.logprob == pytest.approx(float(expected[t]), abs=1e-3)
            changed += abs(float(raw[t]) - logprob.logprob) > 1e-2
    assert changed > 0  # the penalties did change the distribution


def test_logits_processor_two_argument_form_sees_outputs_and_can_steer(llm):
    record, calls = recorder(with_prompt=False)
    target = llm.get_tokenizer().encode(" banana", add_special_tokens=False)[0]

    def force(output_ids, logits):
        logits[target] += 1000.0
        return logits

    out = generate(llm, PROMPT, temperature=0.0, max_tokens=4, ignore_eos=True, logits_processors=[record, force])
    assert out.token_ids == [target] * 4
    assert [c[1] for c in calls] == [[], [target], [target] * 2, [target] * 3]


def test_logit_bias_and_allowed_token_ids(llm):
    tokenizer = llm.get_tokenizer()
    plain = generate(llm, PROMPT, temperature=0.0, max_tokens=6, ignore_eos=True).token_ids
    favourite = tokenizer.encode(" zebra", add_special_tokens=False)[0]
    biased = generate(llm, PROMPT, temperature=0.0, max_tokens=6, ignore_eos=True, logit_bias={favourite: 100})
    assert favourite not in plain and biased.token_ids == [favourite] * 6
    allowed = [tokenizer.encode(w, add_special_tokens=False)[0] for w in (" red", " green", " blue")]
    restricted = generate(llm, PROMPT, temperature=1.0, seed=0, max_tokens=8, ignore_eos=True,
                          allowed_token_ids=allowed)
    assert set(restricted.token_ids) <= set(allowed) and not set(plain) <= set(allowed)


@pytest.mark.slow
def test_bad_words_with_and_without_leading_space(llm):
    tokenizer = llm.get_tokenizer()
    plain = generate(llm, PROMPT, temperature=0.0, max_tokens=16, ignore_eos=True)
    word = plain.text.split()[1]  # a word the model does produce after a space
    banned = generate(llm, PROMPT, temperature=0.0, max_tokens=16, ignore_eos=True, bad_words=[word])
    for variant in (word, " " + word):
        ids = tokenizer.encode(variant, add_special_tokens=False)
        windows = [banned.token_ids[i:i + len(ids)] for i in range(len(banned.token_ids))]
        assert ids not in windows
    spaced = tokenizer.encode(" " + word, add_special_tokens=False)
    assert any(plain.token_ids[i:i + len(spaced)] == spaced for i in range(len(plain.token_ids)))
    # A bad word of several tokens only bans its last token after the ones before it.
    pair = plain.token_ids[2:4]
    phrase = tokenizer.decode(pair)
    if len(tokenizer.encode(phrase.lstrip(), add_special_tokens=False)) > 1:
        blocked = generate(llm, PROMPT, temperature=0.0, max_tokens=16, ignore_eos=True, bad_words=[phrase])
        assert blocked.token_ids[:2] == plain.token_ids[:2] and blocked.token_ids[2:4] != pair


@pytest.mark.slow
def test_min_tokens_holds_back_eos_and_stop_token_ids(llm):
    assert len(generate(llm, EOS_FIRST, temperature=0.0, max_tokens=8).token_ids) == 1
    held = generate(llm, EOS_FIRST, temperature=0.0, max_tokens=8, min_tokens=4)
    eos = llm.get_tokenizer().eos_token_id
    assert len(held.token_ids) >= 4 and eos not in held.token_ids[:4]
    first = generate(llm, PROMPT, temperature=0.0, max_tokens=1).token_ids[0]
    stopped = generate(llm, PROMPT, temperature=0.0, max_tokens=8, stop_token_ids=[first])
    assert stopped.token_ids == [first] and stopped.stop_reason == first
    later = generate(llm, PROMPT, temperature=0.0, max_tokens=8, stop_token_ids=[first], min_tokens=3)
    assert first not in later.token_ids[:3] and len(later.token_ids) >= 3


@pytest.mark.slow
def test_n_returns_indexed_completions_from_seeded_sub_requests(llm):
    output = llm.generate(PROMPT, SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=8, ignore_eos=True),
                          use_tqdm=False)[0]
    assert [c.index for c in output.outputs] == [0, 1, 2] and output.finished
    for i, completion in enumerate(output.outputs):
        alone = generate(llm, PROMPT, temperature=1.0, seed=7 + i, max_tokens=8, ignore_eos=True)
        assert completion.token_ids == alone.token_ids
    assert len({tuple(c.token_ids) for c in output.outputs}) > 1


@pytest.mark.slow
def test_best_of_keeps_the_best_by_cumulative_logprob(llm):
    output = llm.generate(PROMPT, SamplingParams(n=1, best_of=3, temperature=1.0, seed=11, max_tokens=6,
                                                 ignore_eos=True), use_tqdm=False)[0]
    assert len(output.outputs) == 1 and output.outputs[0].logprobs is None
    candidates = [generate(llm, PROMPT, temperature=1.0, seed=11 + i, max_tokens=6, ignore_eos=True, logprobs=0)
                  for i in range(3)]
    best = max(candidates, key=lambda c: c.cumulative_logprob)
    assert output.outputs[0].token_ids == best.token_ids
    assert output.outputs[0].cumulative_logprob == pytest.approx(best.cumulative_logprob, abs=1e-4)


def _stream(llm, request_id, params):
    engine = llm.llm_engine
    engine.add_request(request_id, PROMPT, params)
    outputs = []
    while engine.has_unfinished_requests():
        outputs.extend(o for o in engine.step() if o.request_id == request_id)
    return outputs


@pytest.mark.slow
def test_output_kinds_delta_cumulative_final_only(llm):
    common = dict(temperature=0.0, max_tokens=12, ignore_eos=True)
    cumulative = _stream(llm, "kinds-c", SamplingParams(**common))
    delta = _stream(llm, "kinds-d", SamplingParams(output_kind=RequestOutputKind.DELTA, **common))
    final = _stream(llm, "kinds-f", SamplingParams(output_kind=RequestOutputKind.FINAL_ONLY, **common))
    full = cumulative[-1].outputs[0]
    assert "".join(o.outputs[0].text for o in delta) == full.text
    assert [t for o in delta for t in o.outputs[0].token_ids] == full.token_ids
    assert delta[0].prompt == PROMPT and delta[0].prompt_token_ids
    assert all(o.prompt is None and o.prompt_token_ids is None for o in delta[1:]) and len(delta) > 1
    assert len(final) == 1 and final[0].finished and final[0].outputs[0].text == full.text
    assert len(cumulative) > 1 and all(o.outputs[0].text for o in cumulative[-3:])


def test_n_with_delta_output_streams_each_index(llm):
    params = SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=6, ignore_eos=True,
                            output_kind=RequestOutputKind.DELTA)
    outputs = _stream(llm, "delta-n", params)
    tokens = {0: [], 1: []}
    for output in outputs:
        for completion in output.outputs:
            tokens[completion.index].extend(completion.token_ids)
    assert outputs[-1].finished and all(len(t) == 6 for t in tokens.values())
    assert outputs[0].prompt == PROMPT and all(o.prompt is None for o in outputs[1:])


def test_detokenize_false_and_skip_special_tokens(llm):
    raw = generate(llm, PROMPT, temperature=0.0, max_tokens=5, ignore_eos=True, detokenize=False, logprobs=2)
    assert raw.text == "" and len(raw.token_ids) == 5
    assert all(lp.decoded_token is None for entry in raw.logprobs for lp in entry.values())
    eos = llm.get_tokenizer().eos_token_id
    specials = dict(temperature=0.0, max_tokens=3, ignore_eos=True, allowed_token_ids=[eos])
    skipped = generate(llm, PROMPT, **specials)
    shown = generate(llm, PROMPT, skip_special_tokens=False, spaces_between_special_tokens=False, **specials)
    assert skipped.token_ids == shown.token_ids == [eos] * 3
    assert skipped.text == "" and shown.text == llm.get_tokenizer().eos_token * 3


def test_truncate_prompt_tokens_keeps_the_last_tokens(llm):
    ids = llm.get_tokenizer().encode(PROMPT)
    output = llm.generate(PROMPT, SamplingParams(max_tokens=2, truncate_prompt_tokens=3), use_tqdm=False)[0]
    assert output.prompt_token_ids == ids[-3:]


def test_out_of_vocab_ids_fail_at_add_request_and_engine_keeps_serving(llm):
    engine = llm.llm_engine
    vocab = engine.get_model_config().vocab_size
    with pytest.raises(ValueError, match="allowed_token_ids"):
        engine.add_request("oov-1", PROMPT, SamplingParams(allowed_token_ids=[vocab + 5]))
    with pytest.raises(ValueError, match="logit_bias"):
        engine.add_request("oov-2", PROMPT, SamplingParams(logit_bias={-1: 2.0}))
    assert generate(llm, PROMPT, temperature=0.0, max_tokens=2).token_ids
