"""Shared fixtures: one engine on the real default model per session, and tiny random-weight models."""
from __future__ import annotations

import os

import pytest
import torch

from pagedllm.model.source import default_model_path

# Small thread counts keep the suite's timings steady on 2 cores.
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(scope="session")
def default_model() -> str:
    return default_model_path()


@pytest.fixture(scope="session")
def llm():
    """The default model behind one LLM shared by the whole session (tests must not change its state)."""
    from pagedllm import LLM

    return LLM()


@pytest.fixture(scope="session")
def tokenizer(llm):
    return llm.get_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer) -> str:
    """A 2-layer Llama with random weights and the default model's tokenizer, as a Hugging Face folder."""
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("tiny-llama")
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="session")
def hf_model(default_model):
    """The default model's weights in Hugging Face transformers' own Llama, the reference for ours."""
    from transformers import AutoConfig, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    folder, file = os.path.split(default_model)
    model = LlamaForCausalLM(AutoConfig.from_pretrained(folder, gguf_file=file))
    tensors = load_gguf_checkpoint(default_model, return_tensors=True, model_to_load=model)["tensors"]
    model.load_state_dict({k: torch.as_tensor(v) for k, v in tensors.items()}, strict=False)
    model.tie_weights()
    return model.eval()
