"""One embedding engine (the default embedding model, all-MiniLM-L6-v2) and its sentence-transformers twin; tiny
random-weight classifier folders (BERT, Llama) with their transformers twins."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session")
def embed_llm():
    from pagedllm import LLM

    return LLM(task="embed")


@pytest.fixture(scope="session")
def st_model(embed_llm):
    """sentence-transformers reading the very folder pagedllm loaded."""
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(embed_llm.llm_engine.model_config.path, device="cpu")


def _save_classifier(model, tokenizer, folder) -> str:
    model.eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def _bert_classifier(folder, num_labels: int):
    """A 2-layer BertForSequenceClassification with random weights (drawn wider than BERT's initialization, so
    that its outputs differ clearly between inputs) and the default embedding model's tokenizer."""
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from pagedllm.model.source import default_embedding_model_path

    tokenizer = AutoTokenizer.from_pretrained(default_embedding_model_path())
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=128, num_labels=num_labels,
                        initializer_range=0.2, architectures=["BertForSequenceClassification"],
                        id2label={i: f"label_{i}" for i in range(num_labels)})
    torch.manual_seed(num_labels)
    model = BertForSequenceClassification(config)
    _save_classifier(model, tokenizer, folder)
    return str(folder), model, tokenizer


@pytest.fixture(scope="session")
def bert_classifier(tmp_path_factory):
    """(folder, transformers model, tokenizer) of a 3-label BERT classifier."""
    return _bert_classifier(tmp_path_factory.mktemp("bert-classifier"), 3)


@pytest.fixture(scope="session")
def bert_cross_encoder(tmp_path_factory):
    """(folder, transformers model, tokenizer) of a 1-label BERT classifier: a cross-encoder."""
    return _bert_classifier(tmp_path_factory.mktemp("bert-cross-encoder"), 1)


@pytest.fixture(scope="session")
def llama_cross_encoder(tmp_path_factory, tokenizer):
    """(folder, transformers model, tokenizer) of a 2-layer LlamaForSequenceClassification with one label and
    the default model's tokenizer."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=96, intermediate_size=192, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, num_labels=1,
                         initializer_range=0.2, pad_token_id=tokenizer.eos_token_id,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    model = LlamaForSequenceClassification(config)
    folder = tmp_path_factory.mktemp("llama-cross-encoder")
    return _save_classifier(model, tokenizer, folder), model, tokenizer
