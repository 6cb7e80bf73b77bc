"""Incremental detokenization: never half a character, the same text as a full decode, stop strings held
back while streaming."""
from __future__ import annotations

import pytest

from pagedllm import SamplingParams
from pagedllm.engine.detokenizer import IncrementalDetokenizer
from pagedllm.sampling_params import RequestOutputKind

MULTIBYTE = "Hello 👋 世界 café — ok 🤖! ünïcödé 😀😀"


def test_no_partial_character_is_ever_emitted(tokenizer):
    ids = tokenizer.encode(MULTIBYTE)
    # Several tokens here are pieces of one character: the test means something only if so.
    assert any("\ufffd" in tokenizer.decode([i]) for i in ids)
    detokenizer = IncrementalDetokenizer(tokenizer, tokenizer.encode("Say:"), True, True)
    pieces = [detokenizer.add_token(i) for i in ids]
    assert all("\ufffd" not in piece for piece in pieces)
    assert "" in pieces  # held while a character was incomplete
    assert "".join(pieces) == tokenizer.decode(ids) == MULTIBYTE


def test_spacing_matches_a_full_decode(tokenizer):
    text = "  Two  spaces,\nnew lines\n\tand tabs; don't split \"quotes\" (or brackets)."
    ids = tokenizer.encode(text)
    detokenizer = IncrementalDetokenizer(tokenizer, tokenizer.encode("Begin"), True, True)
    assert "".join(detokenizer.add_token(i) for i in ids) == text


def test_special_tokens_are_skipped_or_kept(tokenizer):
    ids = tokenizer.encode("Hi<|im_end|> there")
    assert tokenizer.eos_token_id in ids
    skip = IncrementalDetokenizer(tokenizer, [1], True, True)
    keep = IncrementalDetokenizer(tokenizer, [1], False, True)
    assert "".join(skip.add_token(i) for i in ids) == "Hi there"
    assert "".join(keep.add_token(i) for i in ids) == "Hi<|im_end|> there"


@pytest.mark.slow
def test_generated_multibyte_text_streams_whole_characters(llm, tokenizer):
    engine = llm.llm_engine
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, output_kind=RequestOutputKind.DELTA)
    engine.add_request("cjk", "日本の首都は", params)
    deltas, final = [], None
    while engine.has_unfinished_requests():
        for output in engine.step():
            deltas.append(output.outputs[0].text)
            final = output
    assert final.finished
    assert all("\ufffd" not in delta for delta in deltas)
    text = "".join(deltas)
    ids = tokenizer.encode("日本の首都は")
    full = llm.generate({"prompt_token_ids": ids}, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
                        use_tqdm=False)[0].outputs[0]
    assert text == full.text == tokenizer.decode(full.token_ids, skip_special_tokens=True)
    assert any(ord(c) > 0x3000 for c in text)


@pytest.mark.slow
@pytest.mark.parametrize("kind", [RequestOutputKind.DELTA, RequestOutputKind.CUMULATIVE])
def test_streamed_text_never_shows_the_start_of_a_stop_string(llm, kind):
    engine = llm.llm_engine
    # Greedy continues " 5, 6, 7, 8": "6, 7" completes over four tokens, and "6, 8" starts to match but never does.
    params = SamplingParams(temperature=0, max_tokens=12, stop=["6, 8", "6, 7"], output_kind=kind)
    engine.add_request(f"stream-{kind.name}", "1, 2, 3, 4,", params)
    seen = []
    while engine.has_unfinished_requests():
        for output in engine.step():
            seen.append((output.outputs[0].text, output.finished))
    texts = [text for text, _ in seen]
    final = "".join(texts) if kind == RequestOutputKind.DELTA else texts[-1]
    assert final == " 5, " and seen[-1][1]
    cumulative = [final[:0]]
    for text in texts:
        cumulative.append(cumulative[-1] + text if kind == RequestOutputKind.DELTA else text)
    assert all(final.startswith(text) for text in cumulative)
    assert any(text for text, finished in seen[:-1])  # text was streamed before the stop, not only at the end
