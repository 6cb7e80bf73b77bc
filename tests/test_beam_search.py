"""LLM.beam_search against Hugging Face transformers' beam search on the same weights."""
from __future__ import annotations

import pytest
import torch

from pagedllm import BeamSearchParams

PROMPTS = ["The history of the city of Paris begins", "Machine learning is a field of study that",
           "The best way to bake bread at home is", "In the year 1900, the largest cities in the world were"]


def _hf_beams(model, prompt_ids, eos, width, max_tokens):
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt_ids]), num_beams=width, num_return_sequences=width,
                             do_sample=False, max_new_tokens=max_tokens, early_stopping=False, length_penalty=1.0,
                             eos_token_id=eos, pad_token_id=eos, attention_mask=torch.ones(1, len(prompt_ids)))
    beams = []
    for row in out.tolist():
        generated = row[len(prompt_ids):]
        beams.append(generated[:generated.index(eos) + 1] if eos in generated else generated)
    return beams


@pytest.mark.slow
def test_beam_search_equals_transformers(llm, hf_model):
    tokenizer = llm.get_tokenizer()
    eos = tokenizer.eos_token_id
    outputs = llm.beam_search([{"prompt": p} for p in PROMPTS], BeamSearchParams(beam_width=4, max_tokens=32))
    for prompt, output in zip(PROMPTS, outputs):
        prompt_ids = tokenizer.encode(prompt)
        ours = [seq.tokens[len(prompt_ids):] for seq in output.sequences]
        assert len(ours) == 4 and all(seq.tokens[:len(prompt_ids)] == prompt_ids for seq in output.sequences)
        assert ours == _hf_beams(hf_model, prompt_ids, eos, 4, 32), prompt
        scores = [seq.cum_logprob / len(tokens) for seq, tokens in zip(output.sequences, ours)]
        assert scores == sorted(scores, reverse=True)
        assert output.sequences[0].text == tokenizer.decode(output.sequences[0].tokens)


@pytest.mark.slow
def test_length_penalty_ranks_by_normalised_score(llm):
    prompt = "Write a short poem about the sea."
    prompt_len = len(llm.get_tokenizer().encode(prompt))

    def best_first(length_penalty: float):
        params = BeamSearchParams(beam_width=3, max_tokens=6, length_penalty=length_penalty)
        sequences = llm.beam_search([prompt], params)[0].sequences
        scores = [s.cum_logprob / (len(s.tokens) - prompt_len) ** length_penalty for s in sequences]
        assert len(sequences) == 3 and scores == sorted(scores, reverse=True)
        return sequences

    # Unnormalised, the one-token EOS continuation has the best cumulative logprob; a strong length
    # penalty divides the longer beams' logprobs by 36 instead of 1, so they overtake it.
    assert best_first(0.0)[0].finish_reason == "stop"
    assert all(s.finish_reason == "length" for s in best_first(2.0))


@pytest.mark.slow
def test_beam_steps_reuse_the_cached_blocks_of_their_prefix(llm, monkeypatch):
    prompt = "Once upon a time, in a small village at the foot of a tall mountain, there lived an old baker who"
    prompt_len = len(llm.get_tokenizer().encode(prompt))
    cached_per_step = []
    generate = llm.generate

    def recording_generate(*args, **kwargs):
        outputs = generate(*args, **kwargs)
        cached_per_step.append([output.num_cached_tokens for output in outputs])
        return outputs

    monkeypatch.setattr(llm, "generate", recording_generate)
    llm.beam_search([prompt], BeamSearchParams(beam_width=3, max_tokens=5))
    assert prompt_len >= 16 and len(cached_per_step) == 5
    for step, cached in enumerate(cached_per_step[1:], start=1):
        # Each beam is the prompt plus `step` tokens: every full block of it is already in the cache.
        assert all(c == (prompt_len + step) // 16 * 16 for c in cached), (step, cached)
