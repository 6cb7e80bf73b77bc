"""The sampler pipeline on hand-made logits: each step against its definition, rows with different params
in one batch."""
from __future__ import annotations

import pytest
import torch

from pagedllm.core.request import Request
from pagedllm.sample.metadata import SamplingMetadata, takes_raw_argmax
from pagedllm.sample.sampler import UNSAMPLEABLE, Sampler
from pagedllm.sampling_params import SamplingParams

VOCAB = 12


def _request(request_id, prompt, output, eos=None, **kwargs):
    request = Request(request_id, list(prompt), SamplingParams(**kwargs), 0.0, eos)
    for token in output:
        request.append_output_token(token)
    return request


def _sample(requests, logits, bitmasks=None):
    meta = SamplingMetadata.build(requests, {}, VOCAB, torch.device("cpu"), bitmasks)
    return Sampler()(logits.clone(), meta)


def test_penalties_follow_their_definitions_per_row():
    torch.manual_seed(0)
    logits = torch.randn(3, VOCAB)
    requests = [
        _request("a", [1, 2], [3, 3, 4], temperature=0, logprobs=VOCAB, presence_penalty=0.5,
                 frequency_penalty=0.25),
        _request("b", [1, 2], [3, 3, 4], temperature=0, logprobs=VOCAB, repetition_penalty=2.0),
        _request("c", [1, 2], [3, 3, 4], temperature=0, logprobs=VOCAB),
    ]
    out = _sample(requests, logits)
    expected = logits.clone()
    expected[0, 3] -= 0.5 + 2 * 0.25
    expected[0, 4] -= 0.5 + 0.25
    for t in (1, 2, 3, 4):
        expected[1, t] = expected[1, t] / 2 if expected[1, t] > 0 else expected[1, t] * 2
    expected = torch.log_softmax(expected, dim=-1)
    got = torch.full_like(expected, float("nan"))
    got.scatter_(1, out.logprob_token_ids, out.logprobs)
    torch.testing.assert_close(got, expected)
    assert out.token_ids.tolist() == expected.argmax(-1).tolist()


def test_bias_allowed_banned_and_min_tokens():
    logits = torch.zeros(4, VOCAB)
    requests = [
        _request("bias", [1], [], temperature=0, logit_bias={7: 5.0}),
        _request("allowed", [1], [], temperature=0, allowed_token_ids=[9]),
        _request("min", [1], [5], eos=0, temperature=0, min_tokens=3, stop_token_ids=[1, 2]),
        _request("bad", [1], [6, 7], temperature=0),
    ]
    requests[3].sampling_params.bad_words_token_ids = [[0], [6, 7, 1], [5, 2]]
    logits[2, [0, 1, 2]] = 10.0
    logits[3, [0, 1, 2]] = torch.tensor([10.0, 9.0, 8.0])
    assert _sample(requests, logits).token_ids.tolist() == [7, 9, 3, 2]


def test_grammar_bitmask_allows_only_its_tokens():
    logits = torch.zeros(2, VOCAB)
    logits[:, 0] = 5.0
    packed = torch.tensor([(1 << 3) | (1 << 10)], dtype=torch.int32)
    out = _sample([_request("g", [1], [], temperature=0), _request("free", [1], [], temperature=0)], logits,
                  {"g": packed})
    assert out.token_ids.tolist() == [3, 0]


def test_logits_processors_get_their_signature():
    seen = {}

    def two(output_ids, logits):
        seen["two"] = list(output_ids)
        logits[8] += 100
        return logits

    def three(prompt_ids, output_ids, logits):
        seen["three"] = (list(prompt_ids), list(output_ids))
        return logits

    requests = [_request("p", [1, 2], [4], temperature=0, logits_processors=[two, three])]
    assert _sample(requests, torch.zeros(1, VOCAB)).token_ids.tolist() == [8]
    assert seen == {"two": [4], "three": ([1, 2], [4])}


@pytest.mark.parametrize("seed", [0, 1])
def test_seeded_rows_ignore_the_rest_of_the_batch(seed):
    logits = torch.randn(3, VOCAB)

    def run(requests, rows):
        generators = {"s": torch.Generator().manual_seed(seed)}
        return Sampler()(logits[rows].clone(), SamplingMetadata.build(requests, generators, VOCAB,
                                                                      torch.device("cpu")))

    alone = run([_request("s", [1], [], seed=seed)], [1])
    batch = run([_request("x", [1], []), _request("s", [1], [], seed=seed), _request("y", [1], [], top_k=2)],
                [0, 1, 2])
    assert batch.token_ids[1] == alone.token_ids[0]


def test_rows_that_cannot_be_sampled_fail_alone_with_why():
    """A row whose largest logit is not finite gets the UNSAMPLEABLE token on the host, with the reason; the
    other rows keep their tokens."""
    logits = torch.randn(4, VOCAB)
    logits[1, 5] = float("nan")
    logits[2] = float("-inf")
    logits[3, 7] = float("inf")
    requests = [_request(name, [1], [], temperature=0, logprobs=2) for name in "abcd"]
    out = _sample(requests, logits)
    tokens, failed = out.to_host()
    assert tokens[0] == int(logits[0].argmax())
    assert tokens[1:] == [UNSAMPLEABLE] * 3
    assert failed == {1: "its logits contain NaN or infinity",
                      2: "every token was masked out, so none can be sampled",
                      3: "its logits contain NaN or infinity"}


@pytest.mark.parametrize("kwargs, raw", [
    (dict(), True),
    (dict(min_tokens=1), True),  # one output already: nothing banned
    (dict(logprobs=0), False),
    (dict(temperature=0.5), False),
    (dict(presence_penalty=0.5), False),
    (dict(frequency_penalty=0.5), False),
    (dict(repetition_penalty=1.2), False),
    (dict(logit_bias={3: 1.0}), False),
    (dict(allowed_token_ids=[1, 2]), False),
    (dict(min_tokens=2), False),  # EOS banned until the second output
    (dict(logits_processors=[lambda output_ids, logits: logits]), False),
    (dict(bad_words_token_ids=[[5]]), False),
    (dict(bad_words_token_ids=[[4, 5]]), False),  # nothing banned now, but a verified position may end in 4
    (dict(grammar=True), False),
])
def test_raw_argmax_rows_are_those_the_sampler_leaves_alone(kwargs, raw):
    """takes_raw_argmax (the rows a CPU graph samples by itself) holds only where the sampler's metadata has
    nothing to apply to the row and no logprobs to report, and everywhere so but for a request with bad words."""
    kwargs = {"temperature": 0.0, **kwargs}
    bad_words, grammar = kwargs.pop("bad_words_token_ids", []), kwargs.pop("grammar", False)
    request = _request("r", [1, 2], [3], eos=7, **kwargs)
    request.sampling_params.bad_words_token_ids = bad_words
    bitmasks = {"r": torch.full((1, 1), -1, dtype=torch.int32)} if grammar else {}
    meta = SamplingMetadata.build([request], {}, VOCAB, torch.device("cpu"), bitmasks)
    untouched = (meta.all_greedy and meta.max_num_logprobs is None and not meta.logits_processors
                 and all(part is None for part in (meta.penalties, meta.logit_bias, meta.allowed, meta.banned,
                                                   meta.grammar)))
    assert takes_raw_argmax(request, bitmasks) == raw
    assert untouched == (raw or kwargs == {"temperature": 0.0} and bad_words == [[4, 5]])
