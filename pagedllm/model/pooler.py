"""From a step's hidden states to one output per pooling request: pick or average token rows (the pooling
type), then the request's post-processing (truncated dimensions, L2 normalization, a classifier's activation,
softmax)."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


def pool_rows(hidden: torch.Tensor, starts: list[int], lengths: list[int], token_ids: list[list[int]],
              pooling_type: str, step_tag_id: Any = None) -> list[torch.Tensor]:
    """hidden [T, H] with sequence i at rows [starts[i], starts[i] + lengths[i]) -> per sequence [H] (LAST, CLS,
    MEAN) or [N, H] (ALL; STEP: the rows of `step_tag_id` tokens, every row if it is None). MEAN sums every
    sequence in one pass over the step's rows: an operator per sequence costs more than its arithmetic."""
    if pooling_type == "MEAN":
        segments = torch.repeat_interleave(torch.arange(len(lengths), device=hidden.device),
                                           torch.tensor(lengths, device=hidden.device))
        total = hidden.new_zeros(len(lengths), hidden.shape[1], dtype=torch.float32)
        total.index_add_(0, segments, hidden[starts[0]:starts[-1] + lengths[-1]].float())
        return list(total / torch.tensor(lengths, dtype=torch.float32, device=hidden.device).unsqueeze(1))
    return [_pool_one(hidden[start:start + n], ids, pooling_type, step_tag_id)
            for start, n, ids in zip(starts, lengths, token_ids)]


def _pool_one(rows: torch.Tensor, token_ids: list[int], pooling_type: str, step_tag_id: Any) -> torch.Tensor:
    if pooling_type == "LAST":
        return rows[-1]
    if pooling_type == "CLS":
        return rows[0]
    if pooling_type == "STEP" and step_tag_id is not None:
        keep = torch.tensor([t == step_tag_id for t in token_ids], device=rows.device)
        return rows[keep]
    return rows


def postprocess(pooled: torch.Tensor, task: str, params: Any, config: Any) -> torch.Tensor:
    """One request's pooled tensor after its parameters (`params`: PoolingParams whose task is set) over the
    model's defaults (`config`: PoolerConfig); float32."""
    data = pooled.float()
    if task == "embed":
        if params.dimensions is not None:
            data = data[..., :params.dimensions]
        normalize = config.normalize if params.normalize is None else params.normalize
        return F.normalize(data, p=2, dim=-1) if normalize else data
    if task in ("classify", "score"):
        # a classification head's logits: its activation (sigmoid for one label, softmax over several) unless
        # the request turns it off
        if params.activation is False:
            return data
        return data.sigmoid() if data.shape[-1] == 1 else data.softmax(dim=-1)
    if config.normalize:
        data = F.normalize(data, p=2, dim=-1)
    softmax = config.softmax if params.softmax is None else params.softmax
    return data.softmax(dim=-1) if softmax else data
