"""The per-row LoRA update of a merged layer against a row-by-row reference: several adapters and base rows in
one batch, fused projections, column- and row-parallel slices, slot eviction."""
from __future__ import annotations

import types

import pytest
import torch

from pagedllm.config import LoRAConfig
from pagedllm.distributed import TensorParallelGroup
from pagedllm.lora.manager import LoRAManager
from pagedllm.lora.peft import LoRAAdapter, LoRAWeights
from pagedllm.lora.request import LoRARequest
from pagedllm.model.parallel_layers import ColumnParallelLinear, RowParallelLinear

IN = 12
RANK = 8


def _adapter(lora_id: int, names: dict[str, tuple[int, int]], rank: int) -> LoRAAdapter:
    """Random A [rank, in] and B [out, rank] for each projection name -> (in, out)."""
    generator = torch.Generator().manual_seed(lora_id)
    return LoRAAdapter(lora_id, rank, {name: LoRAWeights(torch.randn(rank, i, generator=generator),
                                                         torch.randn(o, rank, generator=generator))
                                       for name, (i, o) in names.items()})


def _setup(max_loras: int):
    qkv = ColumnParallelLinear(IN, [(2, 6), (0, 4), (1, 3)])  # this rank's rows of three projections
    down = RowParallelLinear((3, 5), 7, TensorParallelGroup())  # this rank's 5 input columns of 8+
    for layer in (qkv, down):
        layer.weight.data.normal_()
    targets = {"q": (qkv, 0), "k": (qkv, 1), "v": (qkv, 2), "down": (down, 0)}
    model = types.SimpleNamespace(lora_targets=lambda: targets)
    config = LoRAConfig(max_loras=max_loras, max_lora_rank=RANK, max_cpu_loras=4, lora_dtype=torch.float32)
    manager = LoRAManager(model, config, hf_config=None, device=torch.device("cpu"))
    shapes = {"q": (IN, 10), "k": (IN, 4), "v": (IN, 5), "down": (9, 7)}
    adapters = {i: _adapter(i, shapes if i != 2 else {"q": shapes["q"]}, rank=RANK if i != 3 else 4)
                for i in (1, 2, 3)}
    for lora_id, adapter in adapters.items():
        manager.host[lora_id] = adapter
    return manager, qkv, down, adapters


def _expected(layer, x: torch.Tensor, adapter, names: list[str]) -> torch.Tensor:
    """One row's output: the base product plus each projection's update in its rows (or input columns)."""
    y = torch.nn.functional.linear(x, layer.weight)
    if adapter is None or not set(names) & set(adapter.weights):
        return y
    if isinstance(layer, RowParallelLinear):
        w = adapter.weights["down"]
        start, count = layer.input_slice
        return y + x @ w.a[:, start:start + count].t() @ w.b.t()
    offset = 0
    for shard, name in enumerate(names):
        start, count = layer.row_slices[shard]
        if name in adapter.weights:
            w = adapter.weights[name]
            y[..., offset:offset + count] += (x @ w.a.t() @ w.b.t())[..., start:start + count]
        offset += count
    return y


@pytest.mark.parametrize("max_loras", [3, 1])
def test_rows_get_their_own_adapter_update(max_loras):
    manager, qkv, down, adapters = _setup(max_loras)
    # Requests of 3, 1, 2 and 1 rows using adapters 1, none, 3 and 1; with one slot, steps of one adapter each.
    plan = [(1, 3), (None, 1), (3, 2), (1, 1)] if max_loras == 3 else [(2, 2), (None, 1), (2, 1)]
    requests = [types.SimpleNamespace(lora_request=LoRARequest(f"a{i}", i, "/unused") if i else None)
                for i, _ in plan]
    counts = [n for _, n in plan]
    starts = [sum(counts[:k]) for k in range(len(counts))]
    assert manager.prepare(requests, counts, starts)
    for layer, width, names in ((qkv, IN, ["q", "k", "v"]), (down, 5, ["down"])):
        x = torch.randn(sum(counts), width)
        got = layer(x)
        rows = [adapters.get(i) for i, n in plan for _ in range(n)]
        expected = torch.stack([_expected(layer, x[t], rows[t], names) for t in range(len(rows))])
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_a_step_without_lora_rows_is_the_base_layer_and_slots_evict_lru():
    manager, qkv, _, _ = _setup(max_loras=2)
    base = types.SimpleNamespace(lora_request=None)
    assert not manager.prepare([base], [4], [0])
    x = torch.randn(4, IN)
    torch.testing.assert_close(qkv(x), torch.nn.functional.linear(x, qkv.weight))
    for lora_id in (1, 2, 3):
        request = types.SimpleNamespace(lora_request=LoRARequest(f"a{lora_id}", lora_id, "/unused"))
        manager.prepare([request], [1], [0])
    assert list(manager.slots) == [2, 3]  # adapter 1, least recently used, gave up its slot
    manager.pin(2)
    manager.prepare([types.SimpleNamespace(lora_request=LoRARequest("a1", 1, "/unused"))], [1], [0])
    assert set(manager.slots) == {2, 1}  # the pinned adapter kept its slot
