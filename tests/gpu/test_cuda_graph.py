"""On a GPU: decode steps replayed from CUDA graphs give what eager steps give, and the engine runs the GPU path
(bfloat16 by default, the Triton kernel, graphs for every captured size). Skipped without CUDA."""
from __future__ import annotations

import pytest
import torch

from pagedllm import LLM, SamplingParams
from pagedllm.worker.cuda_graph import CudaDecodeGraphs

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

# Twelve requests that finish one after another: decode batches from 12 down to 1 (padded to 16, 8, 4, 2, 1),
# with prompts and outputs that cross block boundaries, so block tables widen.
PROMPTS = [{"prompt_token_ids": list(range(10 + i, 30 + 3 * i))} for i in range(12)]
PARAMS = [SamplingParams(temperature=0.0, max_tokens=4 + 4 * i, ignore_eos=True, logprobs=2) for i in range(12)]


# A fixed KV cache (about 0.75 GB for the default model): engines of one session then fit side by side.
GPU_BLOCKS = 2048


def _runner(llm: LLM):
    return llm.llm_engine.model_executor.worker.model_runner


def _generate(model: str, **kwargs) -> tuple[LLM, list]:
    llm = LLM(model, device="cuda", num_gpu_blocks_override=GPU_BLOCKS, enable_prefix_caching=False, **kwargs)
    return llm, llm.generate(PROMPTS, PARAMS, use_tqdm=False)


def test_the_gpu_path_is_bfloat16_with_graphs_of_vllms_sizes(default_model):
    llm = LLM(default_model, device="cuda", num_gpu_blocks_override=GPU_BLOCKS, max_num_seqs=64)
    runner = _runner(llm)
    assert next(runner.model.parameters()).dtype == torch.bfloat16
    assert isinstance(runner.decode_graphs, CudaDecodeGraphs)
    assert sorted(runner.decode_graphs.graphs) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    eager = LLM(default_model, device="cuda", num_gpu_blocks_override=GPU_BLOCKS, enforce_eager=True)
    assert _runner(eager).decode_graphs is None


def test_replayed_decode_steps_equal_eager_ones(default_model):
    """float32, so that the comparison is not lost in bfloat16 rounding: padding a batch may change which GEMM
    kernel cuBLAS picks, so logprobs are close, not bitwise equal."""
    _, eager = _generate(default_model, dtype="float32", enforce_eager=True)
    llm, replayed = _generate(default_model, dtype="float32", cuda_graph_sizes=[16])
    assert sorted(_runner(llm).decode_graphs.graphs) == [1, 2, 4, 8, 16]
    for got, want in zip(replayed, eager):
        assert got.outputs[0].token_ids == want.outputs[0].token_ids
        for got_step, want_step in zip(got.outputs[0].logprobs, want.outputs[0].logprobs):
            assert {t: p.logprob for t, p in got_step.items()} == pytest.approx(
                {t: p.logprob for t, p in want_step.items()}, abs=1e-3)


def test_bfloat16_graphs_agree_with_eager_bfloat16(default_model):
    _, eager = _generate(default_model, enforce_eager=True)
    _, replayed = _generate(default_model, cuda_graph_sizes=[16])
    same = sum(g.outputs[0].token_ids == w.outputs[0].token_ids for g, w in zip(replayed, eager))
    # bfloat16 rounding differs with the padded GEMM shapes: a near tie may flip late in a long output.
    assert same >= len(PROMPTS) - 2, same
