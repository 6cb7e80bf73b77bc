"""The pooling endpoints of `pagedllm serve --task embed` through the openai client and httpx, of a cross-encoder
(a one-label BERT classifier) and of a multi-label classifier (which classifies but cannot score), and their refusal
by a generating model."""
from __future__ import annotations

import base64

import httpx
import numpy as np
import openai
import pytest
import torch

from tests.entrypoints.conftest import API_KEY
from tests.pooling.classifier_folders import bert_classifier_folder

pytestmark = pytest.mark.slow
TEXTS = ["A man is eating food.", "A man is riding a horse on a sunny beach.", "The new movie is awesome."]


@pytest.fixture(scope="module")
def embed_server(tmp_path_factory, launch_server):
    with launch_server(tmp_path_factory.mktemp("embed-server"), ["--task", "embed", "--api-key", API_KEY]) as server:
        yield server


@pytest.fixture(scope="module")
def client(embed_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{embed_server.url}/v1", api_key=API_KEY)


@pytest.fixture(scope="module")
def http(embed_server) -> httpx.Client:
    return httpx.Client(base_url=embed_server.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60)


@pytest.fixture(scope="module")
def reference(embed_server) -> torch.Tensor:
    from sentence_transformers import SentenceTransformer

    from pagedllm.model.source import default_embedding_model_path

    return SentenceTransformer(default_embedding_model_path(), device="cpu").encode(TEXTS, convert_to_tensor=True)


def _vectors(response) -> torch.Tensor:
    """Embeddings as rows; base64 ones decoded as OpenAI's client does (little-endian float32)."""
    rows = [d.embedding for d in sorted(response.data, key=lambda d: d.index)]
    return torch.tensor([np.frombuffer(base64.b64decode(r), dtype="<f4").tolist() if isinstance(r, str) else r
                         for r in rows])


def test_embeddings_float_and_base64_are_the_same_vectors(client, reference):
    floats = client.embeddings.create(model="all-MiniLM-L6-v2", input=TEXTS, encoding_format="float")
    packed = client.embeddings.create(model="all-MiniLM-L6-v2", input=TEXTS, encoding_format="base64")
    # Without encoding_format the client asks for base64 itself and decodes it.
    decoded_by_client = client.embeddings.create(model="all-MiniLM-L6-v2", input=TEXTS)
    assert isinstance(packed.data[0].embedding, str)
    # Equal up to float32 rounding: a text's batch mates (and so its padding) may differ between requests.
    assert torch.allclose(_vectors(floats), _vectors(packed), atol=1e-6)
    assert torch.allclose(_vectors(floats), _vectors(decoded_by_client), atol=1e-6)
    assert torch.nn.functional.cosine_similarity(_vectors(floats), reference, dim=1).min() >= 0.99999
    assert floats.usage.prompt_tokens == floats.usage.total_tokens > len(TEXTS)


def test_embeddings_of_token_ids_and_dimensions(client, http):
    ids = http.post("/tokenize", json={"prompt": TEXTS[0]}).json()["tokens"]
    by_text = client.embeddings.create(model="all-MiniLM-L6-v2", input=TEXTS[0])
    by_ids = client.embeddings.create(model="all-MiniLM-L6-v2", input=[ids, ids])
    assert len(by_ids.data) == 2 and by_ids.usage.prompt_tokens == 2 * len(ids)
    assert torch.allclose(_vectors(by_ids)[0], _vectors(by_text)[0], atol=1e-6)
    short = client.embeddings.create(model="all-MiniLM-L6-v2", input=TEXTS[0], dimensions=32)
    assert len(short.data[0].embedding) == 32
    assert torch.linalg.norm(_vectors(short)[0]).item() == pytest.approx(1.0, abs=1e-5)


def test_score_rerank_and_pooling(http, reference):
    expected = torch.nn.functional.cosine_similarity(reference[0:1], reference[1:], dim=1).tolist()
    for path in ("/score", "/v1/score"):
        body = http.post(path, json={"text_1": TEXTS[0], "text_2": TEXTS[1:]}).json()
        assert [d["score"] for d in body["data"]] == pytest.approx(expected, abs=1e-5)
    ranked = http.post("/rerank", json={"query": TEXTS[0], "documents": TEXTS[1:], "top_n": 1}).json()
    best = max(range(2), key=lambda i: expected[i])
    assert [(r["index"], r["document"]["text"]) for r in ranked["results"]] == [(best, TEXTS[1 + best])]
    assert ranked["results"][0]["relevance_score"] == pytest.approx(expected[best], abs=1e-5)
    pooled = http.post("/pooling", json={"input": TEXTS[2]}).json()
    assert pooled["data"][0]["object"] == "pooling"
    assert torch.nn.functional.cosine_similarity(torch.tensor(pooled["data"][0]["data"]), reference[2], dim=0) > 0.99999


@pytest.mark.parametrize("path, body, message", [
    ("/v1/embeddings", {"input": ""}, "empty text"),
    ("/v1/embeddings", {"input": []}, "must not be empty"),
    ("/v1/embeddings", {"input": "word " * 400}, "maximum model length of 256"),
    ("/v1/embeddings", {"input": "text", "dimensions": 1000}, "dimensions"),
    ("/classify", {"input": "text"}, "does not support the Classification API"),
    ("/v1/completions", {"prompt": "Hello", "max_tokens": 2}, "takes PoolingParams"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}, "takes PoolingParams"),
])
def test_bad_requests_are_400s_naming_the_problem(http, path, body, message):
    response = http.post(path, json={"model": "all-MiniLM-L6-v2", **body})
    assert response.status_code == 400, response.text
    assert message in response.json()["error"]["message"]
    assert http.post("/v1/embeddings", json={"input": "still serving"}).status_code == 200


@pytest.mark.parametrize("path, body", [
    ("/v1/embeddings", {"input": "text"}), ("/pooling", {"input": "text"}), ("/score", {"text_1": "a", "text_2": "b"}),
    ("/rerank", {"query": "a", "documents": ["b"]}), ("/classify", {"input": "text"}),
])
def test_a_generating_model_refuses_pooling_endpoints(tiny_server, path, body):
    response = httpx.post(f"{tiny_server.url}{path}", json=body, headers={"Authorization": f"Bearer {API_KEY}"},
                          timeout=60)
    assert response.status_code == 400, response.text
    assert "task='generate'" in response.json()["error"]["message"]


@pytest.fixture(scope="module")
def bert_classifier(request, tmp_path_factory, launch_server):
    """(HTTP client, transformers model, tokenizer) of a tiny BERT classifier with `request.param` labels,
    served with --task auto."""
    labels = request.param
    folder, model, tokenizer = bert_classifier_folder(tmp_path_factory.mktemp(f"labels-{labels}"), labels)
    with launch_server(tmp_path_factory.mktemp(f"labels-{labels}-server"), [folder, "--api-key", API_KEY]) as server:
        yield (httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60),
               model, tokenizer)


@pytest.mark.parametrize("bert_classifier", [1], indirect=True, ids=["cross-encoder"])
def test_a_cross_encoder_serves_classify_score_and_rerank(bert_classifier):
    http, model, tokenizer = bert_classifier
    with torch.no_grad():
        pair_logits = torch.cat([model(**tokenizer(TEXTS[0], text, return_tensors="pt")).logits[0]
                                 for text in TEXTS[1:]])
        single_logits = model(**tokenizer(TEXTS[2], return_tensors="pt")).logits[0]
    for path in ("/score", "/v1/score"):
        body = http.post(path, json={"text_1": TEXTS[0], "text_2": TEXTS[1:]}).json()
        assert [d["score"] for d in body["data"]] == pytest.approx(pair_logits.sigmoid().tolist(), abs=1e-5)
    raw = http.post("/score", json={"text_1": TEXTS[0], "text_2": TEXTS[1], "activation": False}).json()
    assert raw["data"][0]["score"] == pytest.approx(pair_logits[0].item(), abs=1e-4)
    ranked = http.post("/rerank", json={"query": TEXTS[0], "documents": TEXTS[1:]}).json()["results"]
    order = pair_logits.argsort(descending=True).tolist()
    assert [r["index"] for r in ranked] == order
    assert [r["relevance_score"] for r in ranked] == pytest.approx(pair_logits.sigmoid()[order].tolist(), abs=1e-5)
    for path in ("/classify", "/v1/classify"):
        data = http.post(path, json={"input": [TEXTS[2]]}).json()["data"][0]
        assert (data["label"], data["num_classes"]) == ("label_0", 1)
        assert data["probs"] == pytest.approx(single_logits.sigmoid().tolist(), abs=1e-5)
    refused = http.post("/v1/embeddings", json={"input": "text"})
    assert refused.status_code == 400 and "does not support the Embeddings API" in refused.json()["error"]["message"]


@pytest.mark.parametrize("bert_classifier", [3], indirect=True, ids=["three-labels"])
def test_a_multi_label_classifier_classifies_but_cannot_score(bert_classifier):
    http, model, tokenizer = bert_classifier
    # As in vLLM, scoring a pair takes a classifier with one label.
    refused = [("/score", {"text_1": TEXTS[0], "text_2": TEXTS[1:]}), ("/v1/score", {"text_1": "a", "text_2": "b"}),
               ("/rerank", {"query": TEXTS[0], "documents": TEXTS[1:]}),
               ("/v2/rerank", {"query": "a", "documents": ["b"]})]
    for path, body in refused:
        response = http.post(path, json=body)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert "its classifier has 3 labels, and scoring a pair in one pass needs one" in error["message"]
        assert error["param"] == "model"
    with torch.no_grad():
        logits = torch.stack([model(**tokenizer(text, return_tensors="pt")).logits[0] for text in TEXTS])
    data = http.post("/classify", json={"input": TEXTS}).json()["data"]
    assert [d["num_classes"] for d in data] == [3] * len(TEXTS)
    assert [d["probs"] for d in data] == [pytest.approx(row, abs=1e-5) for row in logits.softmax(-1).tolist()]
    assert [d["label"] for d in data] == [f"label_{i}" for i in logits.argmax(-1).tolist()]
