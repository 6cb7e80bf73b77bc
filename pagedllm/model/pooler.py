"""From a step's hidden states to one output per pooling request: pick or average token rows (the pooling
type), then the request's post-processing (truncated dimensions, L2 normalization, a classifier's activation,
softmax)."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


def pool_rows(hidden: torch.Tensor, start: int, length: int, token_ids: list[int], pooling_type: str,
              step_tag_id: Any = None) -> torch.Tensor:
    """hidden [T, H]; one sequence at rows [start, start + length) -> [H] (LAST, CLS, MEAN) or [N, H]
    (ALL; STEP: the rows of `step_tag_id` tokens, every row if it is None)."""
    rows = hidden[start:start + length]
    if pooling_type == "LAST":
        return rows[-1]
    if pooling_type == "CLS":
        return rows[0]
    if pooling_type == "MEAN":
        return rows.float().mean(0)
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
