"""One embedding engine (the default embedding model, all-MiniLM-L6-v2) and its sentence-transformers twin; tiny
random-weight classifier folders (BERT, Llama) with their transformers twins."""
from __future__ import annotations

import pytest

from tests.pooling.classifier_folders import bert_classifier_folder, llama_classifier_folder


@pytest.fixture(scope="session")
def embed_llm():
    from pagedllm import LLM

    return LLM(task="embed")


@pytest.fixture(scope="session")
def st_model(embed_llm):
    """sentence-transformers reading the very folder pagedllm loaded."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(embed_llm.llm_engine.model_config.path, device="cpu")


@pytest.fixture(scope="session")
def bert_classifier(tmp_path_factory):
    """(folder, transformers model, tokenizer) of a 3-label BERT classifier."""
    return bert_classifier_folder(tmp_path_factory.mktemp("bert-classifier"), 3)


@pytest.fixture(scope="session")
def bert_cross_encoder(tmp_path_factory):
    """(folder, transformers model, tokenizer) of a 1-label BERT classifier: a cross-encoder."""
    return bert_classifier_folder(tmp_path_factory.mktemp("bert-cross-encoder"), 1)


@pytest.fixture(scope="session")
def llama_cross_encoder(tmp_path_factory, tokenizer):
    """(folder, transformers model, tokenizer) of a 1-label Llama classifier with the default model's tokenizer."""
    return llama_classifier_folder(tmp_path_factory.mktemp("llama-cross-encoder"), tokenizer, 1)
