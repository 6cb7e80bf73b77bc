"""The default decoder (SmolLM2) as an embedder and reward model, against transformers' last hidden states."""
from __future__ import annotations

import pytest
import torch

from tests.pooling.sentences import SENTENCES

pytestmark = pytest.mark.slow
PROMPTS = SENTENCES[:3] + [SENTENCES[22]]


@pytest.fixture(scope="module")
def decoder_embedder(default_model):
    from pagedllm import LLM

    return LLM(default_model, task="embed")


@pytest.fixture(scope="module")
def hidden_states(hf_model, decoder_embedder) -> list[torch.Tensor]:
    """transformers' last hidden state (after the final norm) at every position of each prompt."""
    tokenizer = decoder_embedder.get_tokenizer()
    with torch.no_grad():
        return [hf_model(torch.tensor([tokenizer.encode(p)]), output_hidden_states=True).hidden_states[-1][0]
                for p in PROMPTS]


def test_embed_is_the_normalized_last_hidden_state(decoder_embedder, hidden_states):
    outputs = decoder_embedder.embed(PROMPTS, use_tqdm=False)
    for output, hidden in zip(outputs, hidden_states):
        expected = torch.nn.functional.normalize(hidden[-1], dim=0)
        ours = torch.tensor(output.outputs.embedding)
        assert torch.nn.functional.cosine_similarity(ours, expected, dim=0) >= 0.9999
        assert torch.allclose(ours, expected, atol=2e-3)


def test_encode_with_all_pooling_returns_every_hidden_state(default_model, hidden_states):
    from pagedllm import LLM

    llm = LLM(default_model, task="reward")
    outputs = llm.reward(PROMPTS[:2], use_tqdm=False)
    for output, hidden in zip(outputs, hidden_states):
        assert output.outputs.data.shape == hidden.shape
        assert torch.nn.functional.cosine_similarity(output.outputs.data, hidden, dim=1).min() >= 0.9999
