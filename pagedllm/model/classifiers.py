"""`*ForSequenceClassification`: a model's pooled hidden state through a classification head, as Hugging Face
builds them. `forward` returns every token's hidden state like the bare model (the pooler picks the rows);
`classify` turns the pooled rows [N, hidden] into logits [N, num_labels].

BERT's head is its checkpoint's pooler (a dense layer and tanh over [CLS]) followed by the classifier; a
decoder's head is one bias-free `score` projection of its last token.
"""
from __future__ import annotations

from typing import Any, Iterable, Iterator, Optional

import torch
from torch import nn

from pagedllm.distributed import SINGLE_PROCESS, ParallelContext
from pagedllm.model.bert import BertModel
from pagedllm.model.llama import LlamaForCausalLM


class BertForSequenceClassification(nn.Module):
    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = config
        self.bert = BertModel(config)
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.requires_grad_(False)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, seq_lens: list[int],
                token_type_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        return self.bert(input_ids, positions, seq_lens, token_type_ids)

    def classify(self, pooled: torch.Tensor) -> torch.Tensor:
        """pooled [N, hidden] (the [CLS] rows) -> logits [N, num_labels]."""
        return self.classifier(torch.tanh(self.pooler(pooled)))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Hugging Face names: `bert.pooler.dense.*` and `classifier.*` are the head, the rest the encoder."""
        head = {f"{module}.{kind}": getattr(getattr(self, module), kind)
                for module in ("pooler", "classifier") for kind in ("weight", "bias")}

        def encoder_weights() -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                ours = name.removeprefix("bert.").replace("pooler.dense.", "pooler.")
                if ours in head:
                    head[ours].data.copy_(tensor)
                else:
                    yield name, tensor

        self.bert.load_weights(encoder_weights())

    def pack_for_cpu(self) -> None:
        self.bert.pack_for_cpu()


class LlamaForSequenceClassification(LlamaForCausalLM):
    """The decoder without its LM head; the last pipeline stage holds the `score` head."""

    def __init__(self, config: Any, parallel: ParallelContext = SINGLE_PROCESS) -> None:
        super().__init__(config, parallel)
        self.lm_head = None  # a classifier has no vocabulary projection
        self.score = nn.Linear(config.hidden_size, config.num_labels, bias=False) if self.norm is not None else None
        self.requires_grad_(False)

    def classify(self, pooled: torch.Tensor) -> torch.Tensor:
        """pooled [N, hidden] (the last tokens' final hidden states) -> logits [N, num_labels]."""
        return self.score(pooled)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        def decoder_weights() -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                if name == "score.weight":
                    if self.score is not None:
                        self.score.weight.data.copy_(tensor)
                else:
                    yield name, tensor

        super().load_weights(decoder_weights())

