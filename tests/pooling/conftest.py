"""One embedding engine (the default embedding model, all-MiniLM-L6-v2) and its sentence-transformers twin."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def embed_llm():
    from pagedllm import LLM

    return LLM(task="embed")


@pytest.fixture(scope="session")
def st_model(embed_llm):
    """sentence-transformers reading the very folder pagedllm loaded."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(embed_llm.llm_engine.model_config.path, device="cpu")
