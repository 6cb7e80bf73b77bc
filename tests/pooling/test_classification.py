"""`*ForSequenceClassification` models against transformers: class probabilities, and a cross-encoder's score of
a text pair computed in one pass (with the pair's token types on BERT)."""
from __future__ import annotations

import pytest
import torch

from pagedllm import LLM, PoolingParams, SamplingParams, TokensPrompt
from tests.pooling.sentences import SENTENCES

QUERY = "Where is the Eiffel Tower?"
DOCUMENTS = ["The Eiffel Tower is in Paris.", "Bananas are rich in potassium.",
             "Paris, the capital of France, is home to the Eiffel Tower, built for the 1889 World's Fair."]


@pytest.fixture(scope="module")
def classifier_llm(bert_classifier):
    return LLM(bert_classifier[0])


@pytest.fixture(scope="module")
def cross_encoder_llm(bert_cross_encoder):
    return LLM(bert_cross_encoder[0], task="score")


def _hf_logits(model, encoded) -> torch.Tensor:
    with torch.no_grad():
        return model(**{k: torch.tensor([v]) for k, v in encoded.items()}).logits[0]


def test_bert_classifier_probabilities_match_transformers(classifier_llm, bert_classifier):
    _, model, tokenizer = bert_classifier
    assert classifier_llm.llm_engine.model_config.task == "classify"  # "auto" from the architecture
    outputs = classifier_llm.classify(SENTENCES, use_tqdm=False)  # one batch of mixed lengths
    logits = torch.stack([_hf_logits(model, tokenizer(s)) for s in SENTENCES])
    probs = torch.tensor([o.outputs.probs for o in outputs])
    assert outputs[0].outputs.num_classes == 3
    assert torch.allclose(probs, logits.softmax(-1), atol=1e-5)
    assert probs.argmax(-1).unique().numel() > 1  # the random head tells the sentences apart
    raw = classifier_llm.classify(SENTENCES[:4], pooling_params=PoolingParams(activation=False), use_tqdm=False)
    assert torch.allclose(torch.tensor([o.outputs.probs for o in raw]), logits[:4], atol=1e-4)


def test_encode_on_a_classifier_honours_softmax(classifier_llm, bert_classifier):
    _, model, tokenizer = bert_classifier
    logits = torch.stack([_hf_logits(model, tokenizer(s)) for s in SENTENCES[:3]])
    default = classifier_llm.encode(SENTENCES[:3], use_tqdm=False)
    raw = classifier_llm.encode(SENTENCES[:3], PoolingParams(softmax=False), use_tqdm=False)
    assert torch.allclose(torch.stack([o.outputs.data for o in default]), logits.softmax(-1), atol=1e-5)
    assert torch.allclose(torch.stack([o.outputs.data for o in raw]), logits, atol=1e-4)


def test_bert_cross_encoder_scores_a_pair_in_one_pass(cross_encoder_llm, bert_cross_encoder):
    _, model, tokenizer = bert_cross_encoder
    outputs = cross_encoder_llm.score(QUERY, DOCUMENTS, use_tqdm=False)
    pairs = [tokenizer(QUERY, document) for document in DOCUMENTS]
    logits = torch.stack([_hf_logits(model, pair)[0] for pair in pairs])
    assert [o.prompt_token_ids for o in outputs] == [pair["input_ids"] for pair in pairs]
    assert torch.allclose(torch.tensor([o.outputs.score for o in outputs]), logits.sigmoid(), atol=1e-5)
    raw = cross_encoder_llm.score(QUERY, DOCUMENTS, pooling_params=PoolingParams(activation=False), use_tqdm=False)
    assert torch.allclose(torch.tensor([o.outputs.score for o in raw]), logits, atol=1e-4)
    # The second text's token type matters: without it the model gives other logits.
    untyped = torch.stack([_hf_logits(model, {**pair, "token_type_ids": [0] * len(pair["input_ids"])})[0]
                           for pair in pairs])
    assert (untyped - logits).abs().max() > 1e-2


def test_cross_encoder_truncation_keeps_the_token_types(cross_encoder_llm, bert_cross_encoder):
    _, model, tokenizer = bert_cross_encoder
    pair = tokenizer(QUERY, DOCUMENTS[2])
    keep = len(pair["input_ids"]) - 3
    output = cross_encoder_llm.score(QUERY, DOCUMENTS[2], truncate_prompt_tokens=keep, use_tqdm=False)[0]
    expected = _hf_logits(model, {k: v[-keep:] for k, v in pair.items()})[0].sigmoid()
    assert abs(output.outputs.score - expected.item()) < 1e-5


def test_token_type_ids_of_a_tokens_prompt_equal_the_pair_score(cross_encoder_llm, bert_cross_encoder):
    _, model, tokenizer = bert_cross_encoder
    pairs = [tokenizer(QUERY, document) for document in DOCUMENTS]
    prompts = [TokensPrompt(prompt_token_ids=p["input_ids"], token_type_ids=p["token_type_ids"]) for p in pairs]
    scores = [o.outputs.score for o in cross_encoder_llm.score(QUERY, DOCUMENTS, use_tqdm=False)]
    probs = [o.outputs.probs[0] for o in cross_encoder_llm.classify(prompts, use_tqdm=False)]
    raw = cross_encoder_llm.encode(prompts, PoolingParams(softmax=False), use_tqdm=False)
    logits = torch.stack([_hf_logits(model, pair)[0] for pair in pairs])
    assert probs == pytest.approx(scores, abs=1e-6)
    assert torch.allclose(torch.tensor(probs), logits.sigmoid(), atol=1e-5)
    assert torch.allclose(torch.stack([o.outputs.data[0] for o in raw]), logits, atol=1e-4)
    # All zeros is the same as no token types, which gives other logits than the pair's.
    untyped = cross_encoder_llm.classify([{"prompt_token_ids": p["input_ids"]} for p in pairs], use_tqdm=False)
    zeros = cross_encoder_llm.classify([{**p, "token_type_ids": [0] * len(p["prompt_token_ids"])} for p in prompts],
                                       use_tqdm=False)
    assert [o.outputs.probs for o in zeros] == [o.outputs.probs for o in untyped]
    assert max(abs(a.outputs.probs[0] - b) for a, b in zip(untyped, probs)) > 1e-3


@pytest.mark.parametrize("types, message", [
    (lambda n: [0] * (n - 1), "token_type_ids must have one entry per prompt token: got 4 for 5"),
    (lambda n: [0, 0, 1, 2, 2], r"within the model's type_vocab_size \(2\): 0 to 1, got \[2\]"),
    (lambda n: [0, 1, 1, 0, 1], "token_type_ids must be zeros then ones"),
    (lambda n: [0, 0, "1", 1, 1], "token_type_ids must be a list of integers"),
])
def test_bad_token_type_ids_are_refused(cross_encoder_llm, types, message):
    ids = [101, 2054, 102, 2003, 102]
    with pytest.raises((ValueError, TypeError), match=message):
        cross_encoder_llm.classify(TokensPrompt(prompt_token_ids=ids, token_type_ids=types(len(ids))),
                                   use_tqdm=False)
    assert cross_encoder_llm.classify({"prompt_token_ids": ids}, use_tqdm=False)[0].outputs.num_classes == 1


def test_token_types_come_one_way_at_a_time(cross_encoder_llm):
    with pytest.raises(ValueError, match="token_type_ids or extra_kwargs"):
        cross_encoder_llm.encode(TokensPrompt(prompt_token_ids=[101, 2054, 102, 2003, 102],
                                              token_type_ids=[0, 0, 0, 1, 1]),
                                 PoolingParams(extra_kwargs={"compressed_token_type_ids": 3}), use_tqdm=False)


def test_models_without_token_types_refuse_them(llm, tokenizer):
    prompt = TokensPrompt(prompt_token_ids=tokenizer.encode("Hello there"), token_type_ids=[0, 0])
    with pytest.raises(ValueError, match="token_type_ids are read only by encoder models .* generates text"):
        llm.generate(prompt, SamplingParams(max_tokens=2), use_tqdm=False)


def test_llama_cross_encoder_matches_transformers(llama_cross_encoder):
    folder, model, tokenizer = llama_cross_encoder
    llm = LLM(folder)
    scores = llm.score(QUERY, DOCUMENTS, use_tqdm=False)
    logits = torch.stack([_hf_logits(model, {"input_ids": tokenizer(QUERY, d)["input_ids"]})[0] for d in DOCUMENTS])
    assert torch.allclose(torch.tensor([o.outputs.score for o in scores]), logits.sigmoid(), atol=1e-5)
    assert (logits.max() - logits.min()) > 1e-2  # the scores tell the documents apart
    probs = llm.classify(SENTENCES[:5], use_tqdm=False)
    single = torch.stack([_hf_logits(model, {"input_ids": tokenizer(s)["input_ids"]}) for s in SENTENCES[:5]])
    assert torch.allclose(torch.tensor([o.outputs.probs for o in probs]), single.sigmoid(), atol=1e-5)
    ids = tokenizer("a", "b")["input_ids"]
    with pytest.raises(ValueError, match="token_type_ids are only read by encoder models"):
        llm.classify(TokensPrompt(prompt_token_ids=ids, token_type_ids=[0] * len(ids)), use_tqdm=False)


def test_wrong_task_for_a_classifier_is_refused(classifier_llm, bert_classifier, llm):
    with pytest.raises(ValueError, match="runs task='generate' and takes SamplingParams"):
        llm.classify("Hello", use_tqdm=False)
    with pytest.raises(ValueError, match="cannot serve 'embed' requests; it serves: classify, encode"):
        classifier_llm.embed("Hello", use_tqdm=False)
    with pytest.raises(ValueError, match="LLM.score needs an embedding model .* or a cross-encoder"):
        classifier_llm.score("a", "b", use_tqdm=False)
    with pytest.raises(ValueError, match="it supports: classify"):
        LLM(bert_classifier[0], task="embed")
    with pytest.raises(ValueError, match="does not support normalize"):
        classifier_llm.classify("Hello", pooling_params=PoolingParams(normalize=True), use_tqdm=False)
