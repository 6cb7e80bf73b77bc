"""What each device gets (attention kernel, decode graphs, dtype) and the CUDA graphs' capture sizes and padding,
checked on CPU: CI has no GPU, so the GPU path's decisions and input layout are tested here."""
from __future__ import annotations

import pytest
import torch

from pagedllm import LLM, EngineArgs
from pagedllm.core.request import Request
from pagedllm.model import triton_attention
from pagedllm.sampling_params import SamplingParams
from pagedllm.worker.batch import build_model_input
from pagedllm.worker.cuda_graph import CudaDecodeGraphs, DecodeInputs
from pagedllm.worker.graph_dispatch import capture_sizes, graph_kind, graph_rows, padded_size

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def test_capture_sizes_follow_vllms_reading_of_cuda_graph_sizes():
    default = capture_sizes([512], max_num_seqs=512)
    assert default[:5] == [1, 2, 4, 8, 16] and default[-1] == 512 and len(default) == 3 + 64
    assert capture_sizes([512], max_num_seqs=256)[-1] == 256
    assert capture_sizes([512], max_num_seqs=100)[-2:] == [96, 104]  # the first size that holds 100 rows
    assert capture_sizes([3], max_num_seqs=256) == [1, 2]
    assert capture_sizes([24, 1, 6, 6], max_num_seqs=256) == [1, 6, 24]


@pytest.mark.parametrize("rows, expected", [(1, 1), (3, 4), (4, 4), (5, 8), (9, 16), (256, 256), (257, None)])
def test_a_batch_runs_the_smallest_size_that_holds_it(rows, expected):
    assert padded_size(rows, capture_sizes([256], max_num_seqs=256)) == expected


@pytest.mark.parametrize("device, dtype, eager, world, kind", [
    (CUDA, torch.bfloat16, False, 1, "cuda"), (CUDA, torch.float32, False, 1, "cuda"),
    (CPU, torch.float32, False, 1, "cpu"), (CPU, torch.bfloat16, False, 1, None),
    (CUDA, torch.bfloat16, True, 1, None), (CPU, torch.float32, True, 1, None),
    (CUDA, torch.bfloat16, False, 2, None), (CPU, torch.float32, False, 2, None)])
def test_each_device_gets_its_graphs_unless_eager_or_sharded(device, dtype, eager, world, kind):
    assert graph_kind(device, dtype, eager, world) == kind


def test_attention_runs_triton_on_cuda_only():
    assert not triton_attention.serves(CPU)
    assert triton_attention.serves(CUDA) == triton_attention.triton_imports()


def test_dtype_auto_is_bfloat16_on_cuda_and_float32_on_cpu(default_model):
    """The config is resolved without a GPU: only the device's name decides."""
    assert EngineArgs(default_model, device="cuda").create_engine_config().model_config.dtype == torch.bfloat16
    assert EngineArgs(default_model, device="cpu").create_engine_config().model_config.dtype == torch.float32
    with pytest.raises(ValueError, match="cuda_graph_sizes"):
        EngineArgs(default_model, cuda_graph_sizes=[0]).create_engine_config()


def _request(name: str, length: int, computed: int, block_ids: list[int]) -> Request:
    request = Request(name, list(range(5, 5 + length)), SamplingParams(max_tokens=1), 0.0)
    request.num_computed_tokens = computed
    request.block_ids = block_ids
    return request


def test_padded_decode_rows_give_the_unpadded_rows_and_write_only_the_padding_block(tiny_model_dir):
    """The CUDA graphs' inputs, run eagerly on CPU: three decode rows padded to a size of eight, after a step of
    eight rows left its slots in the buffers, give the eager step's hidden states and cache, and the padding
    rows write nowhere but the padding block."""
    block, padding_block = 16, 31
    llm = LLM(tiny_model_dir, device="cpu", enforce_eager=True, num_gpu_blocks_override=32, block_size=block)
    runner = llm.llm_engine.model_executor.worker.model_runner
    model, caches = runner.model, runner.kv_caches[0]
    lengths = [5, 20, 40]
    tables = [[0], [1, 2], [3, 4, 5]]
    prefill = build_model_input([(_request(str(i), n, 0, t), n - 1) for i, (n, t) in enumerate(zip(lengths, tables))],
                                block, CPU)
    model.forward_stage(prefill.input_ids, prefill.positions, caches, prefill.attn_metadata)
    decode = build_model_input([(_request(str(i), n, n - 1, t), 1) for i, (n, t) in enumerate(zip(lengths, tables))],
                               block, CPU)
    before = [c.clone() for kv in caches for c in kv]
    expected = model.forward_stage(decode.input_ids, decode.positions, caches, decode.attn_metadata)
    eager_cache = [c.clone() for kv in caches for c in kv]
    for cache, saved in zip([c for kv in caches for c in kv], before):
        cache.copy_(saved)

    inputs = DecodeInputs(8, max_blocks=4, block_size=block, padding_block=padding_block, device=CPU)
    inputs.slot_mapping.copy_(torch.arange(8) * block)  # a larger earlier step's slots: blocks 0-7
    inputs.block_tables.fill_(0)
    assert graph_rows(decode, max_rows=8, max_blocks=4) == 3
    inputs.fill(decode, 8)
    hidden = inputs.forward(model, caches, 8)
    assert torch.equal(hidden[:3], expected)
    assert inputs.slot_mapping[3:].eq(padding_block * block).all() and inputs.context_lens[3:].eq(1).all()
    for cache, want in zip([c for kv in caches for c in kv], eager_cache):
        assert torch.equal(cache[:, :padding_block], want[:, :padding_block])
        assert cache[:, padding_block].abs().sum() > 0  # the padding rows wrote here


def test_graphs_take_steps_within_their_sizes_only():
    block = 4
    decodes = build_model_input([(_request(str(i), 9, 8, [0, 1, 2]), 1) for i in range(3)], block, CPU)
    assert graph_rows(decodes, max_rows=4, max_blocks=3) == 3
    assert graph_rows(decodes, max_rows=2, max_blocks=3) is None  # more rows than the largest size
    assert graph_rows(decodes, max_rows=4, max_blocks=2) is None  # tables wider than the graph's
    mixed = build_model_input([(_request("a", 9, 8, [0, 1, 2]), 1), (_request("b", 5, 0, [3, 4]), 5)], block, CPU)
    assert graph_rows(mixed, max_rows=4, max_blocks=3) is None  # prefill tokens
    # CPU graphs take them, each prompt token a row: 5 of them and the decode.
    assert graph_rows(mixed, max_rows=8, max_blocks=3, prefill_tokens=True) == 6
    assert graph_rows(mixed, max_rows=5, max_blocks=3, prefill_tokens=True) is None
    assert graph_rows(mixed, max_rows=8, max_blocks=1, prefill_tokens=True) is None  # the prompt's 2 blocks
    last_prompt_token = _request("c", 9, 8, [0, 1, 2])
    last_prompt_token.prompt_embeds = torch.zeros(9, 16)
    embedded = build_model_input([(last_prompt_token, 1)], block, CPU)
    assert embedded.attn_metadata.num_decodes == 1 and embedded.prompt_embeds is not None
    assert graph_rows(embedded, max_rows=4, max_blocks=3) is None  # an embedding, which graphs cannot take


class _EagerGraph:
    """A captured CUDA graph's stand-in on CPU: a replay runs the forward pass over the static inputs eagerly
    into the graph's output, and says which size it was."""

    def __init__(self, graphs: CudaDecodeGraphs, size: int, replayed: list[int]) -> None:
        self.graphs, self.size, self.replayed = graphs, size, replayed

    def replay(self) -> None:
        self.replayed.append(self.size)
        g = self.graphs
        g.outputs[self.size].copy_(g.inputs.forward(g.model, g.kv_caches, self.size))


def test_cuda_graphs_replay_the_padded_size_and_return_the_batchs_rows(tiny_model_dir):
    block = 16
    llm = LLM(tiny_model_dir, device="cpu", enforce_eager=True, num_gpu_blocks_override=32, block_size=block)
    runner = llm.llm_engine.model_executor.worker.model_runner
    model, caches = runner.model, runner.kv_caches[0]
    graphs = CudaDecodeGraphs(model, caches, max_model_len=64, block_size=block, sizes=[1, 2, 4, 8], padding_block=31)
    replayed: list[int] = []
    for size in graphs.sizes:
        graphs.graphs[size] = _EagerGraph(graphs, size, replayed)
        graphs.outputs[size] = torch.zeros(size, model.embed_tokens.embedding_dim)
    decode = build_model_input([(_request(str(i), 9 + i, 8 + i, [i]), 1) for i in range(3)], block, CPU)
    expected = model.forward_stage(decode.input_ids, decode.positions, caches, decode.attn_metadata)
    assert torch.equal(graphs.forward(decode), expected)
    assert replayed == [4]
    too_many = build_model_input([(_request(str(i), 9, 8, [i]), 1) for i in range(9)], block, CPU)
    too_long = build_model_input([(_request("long", 70, 69, [0, 1, 2, 3, 4]), 1)], block, CPU)
    prefill = build_model_input([(_request("p", 9, 0, [0]), 9)], block, CPU)
    assert graphs.forward(too_many) is None and graphs.forward(too_long) is None and graphs.forward(prefill) is None
    assert replayed == [4]
