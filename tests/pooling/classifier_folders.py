"""Tiny `*ForSequenceClassification` folders with random weights, saved by transformers with a tokenizer; each
builder returns (folder, the transformers model, the tokenizer) so tests can compare against the model."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

# Wider than the models' default initialization (0.02), so that outputs differ clearly between inputs.
INIT_RANGE = 0.2


def _save(model: Any, tokenizer: Any, folder: Path) -> tuple[str, Any, Any]:
    model.eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder), model, tokenizer


def bert_classifier_folder(folder: Path, num_labels: int) -> tuple[str, Any, Any]:
    """A 2-layer BertForSequenceClassification with the default embedding model's tokenizer (one label: a
    cross-encoder)."""
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from pagedllm.model.source import default_embedding_model_path

    tokenizer = AutoTokenizer.from_pretrained(default_embedding_model_path())
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=128, num_labels=num_labels,
                        initializer_range=INIT_RANGE, architectures=["BertForSequenceClassification"],
                        id2label={i: f"label_{i}" for i in range(num_labels)})
    torch.manual_seed(num_labels)
    return _save(BertForSequenceClassification(config), tokenizer, folder)


def llama_classifier_folder(folder: Path, tokenizer: Any, num_labels: int) -> tuple[str, Any, Any]:
    """A 2-layer LlamaForSequenceClassification with `tokenizer`."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=96, intermediate_size=192, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         num_labels=num_labels, initializer_range=INIT_RANGE, pad_token_id=tokenizer.eos_token_id,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         architectures=["LlamaForSequenceClassification"])
    torch.manual_seed(num_labels)
    return _save(LlamaForSequenceClassification(config), tokenizer, folder)
