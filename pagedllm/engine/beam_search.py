"""Beam search over the engine: every step, all live beams of all prompts run as one batch of one-token
requests whose top 2 * beam_width logprobs propose the candidates. With prefix caching (on by default) each
such request finds every full block of its beam already cached, so a step computes at most one block's
tokens per beam, never the whole sequence again.

Selection follows Hugging Face transformers: per prompt, the 2 * beam_width best candidates by cumulative
logprob are visited in order; an EOS candidate among the first beam_width becomes a finished hypothesis,
the others fill the beam_width running beams. A hypothesis scores cumulative logprob / (generated length **
length_penalty). A prompt is done once it has beam_width hypotheses and its best running beam cannot beat
the worst of them, or at max_tokens, when the running beams finish too.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional, Union

from pagedllm.outputs import Logprob
from pagedllm.sampling_params import BeamSearchParams


@dataclass
class BeamSearchSequence:
    """One beam: the prompt and generated tokens, the logprobs of the generated ones, and its text."""

    tokens: list[int]
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    cum_logprob: float = 0.0
    text: Optional[str] = None
    finish_reason: Optional[str] = None
    stop_reason: Union[int, str, None] = None


@dataclass
class BeamSearchOutput:
    """The best beam_width sequences of one prompt, best first."""

    sequences: list[BeamSearchSequence]


# Token lists -> for each, the candidate next tokens and their logprobs.
ExpandFn = Callable[[list[list[int]]], list[dict[int, Logprob]]]


class _PromptBeams:
    def __init__(self, prompt_tokens: list[int], params: BeamSearchParams) -> None:
        self.prompt_len = len(prompt_tokens)
        self.params = params
        self.running = [BeamSearchSequence(list(prompt_tokens))]
        self.finished: list[BeamSearchSequence] = []
        self.done = False

    def score(self, beam: BeamSearchSequence) -> float:
        return beam.cum_logprob / ((len(beam.tokens) - self.prompt_len) ** self.params.length_penalty)

    def advance(self, candidates: list[dict[int, Logprob]], eos_ids: set[int], last_step: bool) -> None:
        """Pick the next running beams from the candidates of each running beam (in the same order)."""
        width = self.params.beam_width
        extended = sorted(((beam.cum_logprob + lp.logprob, beam, token, lp) for beam, tops in
                           zip(self.running, candidates) for token, lp in tops.items()),
                          key=lambda c: c[0], reverse=True)[:2 * width]
        running = []
        for rank, (cum, beam, token, lp) in enumerate(extended):
            is_eos = token in eos_ids and not self.params.ignore_eos
            if is_eos and rank >= width:
                continue
            new = BeamSearchSequence(beam.tokens + [token], beam.logprobs + [{token: lp}], cum)
            if is_eos:
                new.finish_reason = "stop"
                self.finished.append(new)
            elif len(running) < width:
                running.append(new)
        self.running = running
        if last_step:
            for beam in running:
                beam.finish_reason = "length"
            self.finished.extend(running)
        self.finished = sorted(self.finished, key=self.score, reverse=True)[:width]
        self.done = last_step or not running or (
            len(self.finished) == width and self.score(running[0]) <= self.score(self.finished[-1]))


def beam_search(prompts: list[list[int]], params: BeamSearchParams, expand: ExpandFn, eos_ids: set[int],
                decode: Optional[Callable[[list[int]], str]]) -> list[BeamSearchOutput]:
    """Run beam search for every prompt (token ids) at once; `expand` runs one batched engine pass."""
    instances = [_PromptBeams(tokens, params) for tokens in prompts]
    for step in range(params.max_tokens):
        live = [instance for instance in instances if not instance.done]
        if not live:
            break
        candidates = expand([beam.tokens for instance in live for beam in instance.running])
        start = 0
        for instance in live:
            count = len(instance.running)
            instance.advance(candidates[start:start + count], eos_ids, step == params.max_tokens - 1)
            start += count
    outputs = []
    for instance in instances:
        for beam in instance.finished:
            beam.text = decode(beam.tokens) if decode is not None else None
        outputs.append(BeamSearchOutput(instance.finished))
    return outputs
