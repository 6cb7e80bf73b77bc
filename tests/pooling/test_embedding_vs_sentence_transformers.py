"""all-MiniLM-L6-v2 through pagedllm against sentence-transformers' encode on the same folder."""
from __future__ import annotations

import pytest
import torch

from pagedllm import EmbeddingRequestOutput, PoolingParams
from tests.pooling.sentences import SENTENCES

MIN_COSINE = 0.99999


@pytest.fixture(scope="module")
def reference(st_model) -> torch.Tensor:
    return st_model.encode(SENTENCES, convert_to_tensor=True, batch_size=8)


def _cosines(outputs: list[EmbeddingRequestOutput], reference: torch.Tensor) -> torch.Tensor:
    ours = torch.tensor([o.outputs.embedding for o in outputs])
    return torch.nn.functional.cosine_similarity(ours, reference, dim=1)


def test_sentences_have_mixed_lengths(embed_llm):
    lengths = [len(embed_llm.get_tokenizer().encode(s)) for s in SENTENCES]
    assert len(SENTENCES) >= 32 and min(lengths) <= 5 and max(lengths) >= 40


def test_one_batch_matches_sentence_transformers(embed_llm, reference):
    outputs = embed_llm.embed(SENTENCES, use_tqdm=False)
    assert [o.outputs.hidden_size for o in outputs] == [384] * len(SENTENCES)
    cosines = _cosines(outputs, reference)
    assert cosines.min() >= MIN_COSINE, cosines


def test_one_by_one_matches_sentence_transformers(embed_llm, reference):
    outputs = [embed_llm.embed(sentence, use_tqdm=False)[0] for sentence in SENTENCES]
    cosines = _cosines(outputs, reference)
    assert cosines.min() >= MIN_COSINE, cosines


def test_embeddings_are_unit_vectors_unless_normalize_is_off(embed_llm):
    normalized = torch.tensor(embed_llm.embed(SENTENCES[:3], use_tqdm=False)[0].outputs.embedding)
    raw = torch.tensor(embed_llm.embed(SENTENCES[:3], use_tqdm=False,
                                       pooling_params=PoolingParams(normalize=False))[0].outputs.embedding)
    assert torch.linalg.norm(normalized).item() == pytest.approx(1.0, abs=1e-5)
    assert abs(torch.linalg.norm(raw).item() - 1.0) > 1e-2
    assert torch.allclose(raw / torch.linalg.norm(raw), normalized, atol=1e-6)


def test_dimensions_keep_the_first_components_renormalized(embed_llm):
    raw = torch.tensor(embed_llm.embed(SENTENCES[4], use_tqdm=False,
                                       pooling_params=PoolingParams(normalize=False))[0].outputs.embedding)
    short = embed_llm.embed(SENTENCES[4], use_tqdm=False, pooling_params=PoolingParams(dimensions=64))[0]
    assert short.outputs.hidden_size == 64
    assert torch.allclose(torch.tensor(short.outputs.embedding), torch.nn.functional.normalize(raw[:64], dim=0),
                          atol=1e-6)


def test_score_of_embedding_pairs_is_their_cosine(embed_llm, reference):
    queries, documents = SENTENCES[:4], SENTENCES[4:8]
    scores = embed_llm.score(queries, documents, use_tqdm=False)
    expected = torch.nn.functional.cosine_similarity(reference[:4], reference[4:8], dim=1)
    assert [s.outputs.score for s in scores] == pytest.approx(expected.tolist(), abs=1e-5)
    one_to_many = embed_llm.score(SENTENCES[0], SENTENCES[1:3], use_tqdm=False)
    assert len(one_to_many) == 2
    assert one_to_many[0].outputs.score == pytest.approx(
        torch.nn.functional.cosine_similarity(reference[0], reference[1], dim=0).item(), abs=1e-5)


def test_token_id_prompts_equal_text_prompts(embed_llm):
    ids = embed_llm.get_tokenizer().encode(SENTENCES[6])
    by_ids = embed_llm.embed({"prompt_token_ids": ids}, use_tqdm=False)[0]
    by_text = embed_llm.embed(SENTENCES[6], use_tqdm=False)[0]
    assert by_ids.prompt_token_ids == ids
    assert torch.allclose(torch.tensor(by_ids.outputs.embedding), torch.tensor(by_text.outputs.embedding))


def test_token_type_ids_reach_the_embedder(embed_llm, st_model):
    tokenizer = embed_llm.get_tokenizer()
    pair = tokenizer(SENTENCES[0], SENTENCES[1])
    assert 1 in pair["token_type_ids"]
    typed, untyped = embed_llm.embed([{"prompt_token_ids": pair["input_ids"], "token_type_ids": pair["token_type_ids"]},
                                      {"prompt_token_ids": pair["input_ids"]}], use_tqdm=False)
    with torch.no_grad():  # the same folder's transformers model, mean-pooled and normalized as the model's config says
        hidden = st_model[0].auto_model(**{k: torch.tensor([v]) for k, v in pair.items()}).last_hidden_state[0]
    expected = torch.nn.functional.normalize(hidden.mean(0), dim=0)
    ours = torch.tensor(typed.outputs.embedding)
    assert torch.nn.functional.cosine_similarity(ours, expected, dim=0) > MIN_COSINE
    assert torch.nn.functional.cosine_similarity(ours, torch.tensor(untyped.outputs.embedding), dim=0) < MIN_COSINE
