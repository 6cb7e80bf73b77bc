"""Decode steps replayed from CPU graphs give exactly what the eager forward pass gives."""
from __future__ import annotations

import pytest
import torch

from pagedllm import LLM, SamplingParams
from pagedllm.model import attention, cpu_kernels, loader
from pagedllm.model.linear_backend import ENV_VAR
from pagedllm.model.linear_timing import BACKENDS, present
from pagedllm.sample import sampler
from pagedllm.worker import cpu_graph
from pagedllm.worker.cpu_graph import CaptureRefused, _OnlyKernels
from pagedllm.worker.graph_arena import GraphArena

# Ten requests that finish one after another: decode batches from 10 down to 1, each replayed from its own
# graph, all graphs over one arena; 40 tokens after prompts of 20-47 cross block boundaries, so block tables
# widen.
PROMPTS = [{"prompt_token_ids": list(range(10 + i, 30 + 3 * i))} for i in range(10)]
PARAMS = [SamplingParams(temperature=0.0, max_tokens=4 + 4 * i, ignore_eos=True, logprobs=2) for i in range(10)]


def _generate(model_dir: str, **kwargs) -> tuple[LLM, list]:
    llm = LLM(model_dir, num_gpu_blocks_override=128, enable_prefix_caching=False, **kwargs)
    return llm, llm.generate(PROMPTS, PARAMS, use_tqdm=False)


def _runner(llm: LLM):
    return llm.llm_engine.model_executor.worker.model_runner


def _assert_same(outputs: list, expected: list) -> None:
    for got, want in zip(outputs, expected):
        assert got.outputs[0].token_ids == want.outputs[0].token_ids
        for got_step, want_step in zip(got.outputs[0].logprobs, want.outputs[0].logprobs):
            assert {t: p.logprob for t, p in got_step.items()} == pytest.approx(
                {t: p.logprob for t, p in want_step.items()}, abs=1e-5)


@pytest.fixture(scope="module")
def eager_run(tiny_model_dir) -> tuple[LLM, list]:
    """The tiny model's outputs without CPU graphs, on the linear backends this machine picks."""
    return _generate(tiny_model_dir, enforce_eager=True)


@pytest.mark.slow
def test_replayed_decode_steps_equal_eager_ones(tiny_model_dir, eager_run):
    eager_llm, eager = eager_run
    assert _runner(eager_llm).decode_graphs is None
    llm, replayed = _generate(tiny_model_dir)
    assert set(_runner(llm).decode_graphs.graphs) == set(range(1, len(PROMPTS) + 1))
    _assert_same(replayed, eager)
    # Every size now replays, each over intermediates that the captures of the others overwrote.
    _assert_same(llm.generate(PROMPTS, PARAMS, use_tqdm=False), eager)


@pytest.mark.slow
def test_greedy_steps_sample_in_the_graph_as_eagerly(tiny_model_dir):
    """Steps whose rows all take the argmax of their logits (greedy, no logprobs) replay the LM head and the
    argmax too; min_tokens keeps one request on the sampler (EOS banned) for its first outputs, so some steps
    mix the two kinds of rows and sample in PyTorch."""
    params = [SamplingParams(temperature=0.0, max_tokens=4 + 4 * i, ignore_eos=True, min_tokens=3 * (i == 9))
              for i in range(10)]
    eager = LLM(tiny_model_dir, num_gpu_blocks_override=128, enable_prefix_caching=False,
                enforce_eager=True).generate(PROMPTS, params, use_tqdm=False)
    llm = LLM(tiny_model_dir, num_gpu_blocks_override=128, enable_prefix_caching=False)
    replayed = llm.generate(PROMPTS, params, use_tqdm=False)
    graphs = _runner(llm).decode_graphs
    assert all(graphs.graphs[size]._greedy_steps is not None for size in range(1, len(PROMPTS) + 1))
    assert [r.outputs[0].token_ids for r in replayed] == [r.outputs[0].token_ids for r in eager]


@pytest.mark.slow
def test_greedy_steps_that_cannot_be_recorded_run_eagerly(tiny_model_dir, monkeypatch):
    """An argmax in PyTorch (no row_max kernel, and no bounded greedy head) is refused: greedy steps take it
    eagerly; the layers replay."""
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    eager = LLM(tiny_model_dir, num_gpu_blocks_override=128, enforce_eager=True).generate(
        PROMPTS, params, use_tqdm=False)
    monkeypatch.setattr(sampler, "load_row_max", lambda: None)
    monkeypatch.setattr(loader, "build_greedy_head", lambda weight, head: None)
    llm = LLM(tiny_model_dir, num_gpu_blocks_override=128)
    replayed = llm.generate(PROMPTS, params, use_tqdm=False)
    graphs = _runner(llm).decode_graphs
    assert graphs.greedy_arena is None and graphs.run_plan is not None and graphs.graphs
    assert [r.outputs[0].token_ids for r in replayed] == [r.outputs[0].token_ids for r in eager]


@pytest.mark.slow
def test_batches_above_the_largest_graph_run_eagerly(tiny_model_dir, monkeypatch):
    _, eager = _generate(tiny_model_dir, enforce_eager=True)
    monkeypatch.setattr(cpu_graph, "MAX_GRAPH_ROWS", 8)
    llm, outputs = _generate(tiny_model_dir)
    assert set(_runner(llm).decode_graphs.graphs) == set(range(1, 9))
    _assert_same(outputs, eager)


@pytest.mark.slow
def test_replayed_prefill_steps_equal_eager_ones(tiny_model_dir):
    """Steps of at most 48 tokens: prompt chunks, alone or beside decodes, replay as rows of a graph."""
    chunked = dict(enable_chunked_prefill=True, max_num_batched_tokens=48, max_num_seqs=16)
    params = [p.clone() for p in PARAMS]
    for p in params:
        p.prompt_logprobs = 2
    llm = LLM(tiny_model_dir, num_gpu_blocks_override=128, enable_prefix_caching=False, **chunked)
    replayed = llm.generate(PROMPTS, params, use_tqdm=False)
    eager = LLM(tiny_model_dir, num_gpu_blocks_override=128, enable_prefix_caching=False, enforce_eager=True,
                **chunked).generate(PROMPTS, params, use_tqdm=False)
    assert max(_runner(llm).decode_graphs.graphs) == 48  # full steps of prompt chunks
    _assert_same(replayed, eager)
    for got, want in zip(replayed, eager):
        assert [step and {t: p.logprob for t, p in step.items()} for step in got.prompt_logprobs] == \
            [step and {t: p.logprob for t, p in step.items()} for step in want.prompt_logprobs]


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_every_linear_backend_replays_as_eager(tiny_model_dir, monkeypatch, backend):
    """oneDNN and MKL linears are PyTorch steps between runs of kernel calls; the panel kernel is a kernel call."""
    if backend not in present():
        pytest.skip(f"no {backend} on this machine")
    monkeypatch.setenv(ENV_VAR, backend)
    _, eager = _generate(tiny_model_dir, enforce_eager=True)
    llm, replayed = _generate(tiny_model_dir)
    assert set(_runner(llm).decode_graphs.graphs) == set(range(1, len(PROMPTS) + 1))
    _assert_same(replayed, eager)


@pytest.mark.slow
@pytest.mark.parametrize("module, loader", [
    (cpu_kernels, "load_layer_ops"),  # the first norm in PyTorch: refused before any kernel ran
    (attention, "load_attention_kernel"),  # attention in PyTorch: refused after the first cache write
])
def test_forward_with_pytorch_operators_runs_eagerly(tiny_model_dir, eager_run, monkeypatch, module, loader):
    _, eager = eager_run
    monkeypatch.setattr(module, loader, lambda *shape: None)
    llm, outputs = _generate(tiny_model_dir)
    graphs = _runner(llm).decode_graphs
    assert graphs.run_plan is None and not graphs.graphs
    _assert_same(outputs, eager)


@torch.inference_mode()  # as in a model runner, where reshape reaches the mode whole
def test_capture_refuses_computation_and_allows_views():
    x = torch.randn(4, 6)
    with _OnlyKernels():
        x.view(2, 12).split([1, 1])
        torch.empty_like(x)
        x.new_empty(3)
        with pytest.raises(CaptureRefused, match="add"):
            x + 1
        with pytest.raises(CaptureRefused, match="copies"):
            x.t().reshape(24)


@pytest.mark.slow
def test_default_model_replays_batch_one_as_eager(llm, default_model):
    """With logprobs the sampler samples each step; without, the graph's greedy step does."""
    prompt = [{"prompt_token_ids": llm.get_tokenizer().encode("The capital of France is")}]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=2)
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    replayed, replayed_greedy = (llm.generate(prompt, p, use_tqdm=False) for p in (params, greedy))
    assert _runner(llm).decode_graphs.graphs[1]._greedy_steps is not None
    eager_llm = LLM(default_model, enforce_eager=True)
    _assert_same(replayed, eager_llm.generate(prompt, params, use_tqdm=False))
    assert replayed_greedy[0].outputs[0].token_ids == replayed[0].outputs[0].token_ids
    assert replayed_greedy[0].outputs[0].token_ids == \
        eager_llm.generate(prompt, greedy, use_tqdm=False)[0].outputs[0].token_ids


@torch.inference_mode()
def test_capture_allocates_contiguous_tensors_in_the_arena():
    arena = GraphArena()
    x = torch.randn(4, 6)
    with _OnlyKernels(arena):
        made = [torch.empty(2, 3), torch.empty_like(x), x.new_empty(5, dtype=torch.long)]
        strided = torch.empty_like(x.t())  # keeps its input's strides: not from the arena
    chunk = arena.chunks[0]
    for tensor, (shape, dtype) in zip(made, [((2, 3), torch.float32), ((4, 6), torch.float32),
                                             ((5,), torch.long)]):
        assert tensor.shape == shape and tensor.dtype == dtype and tensor.is_contiguous()
        assert tensor.untyped_storage().data_ptr() == chunk.data_ptr()
    assert strided.untyped_storage().data_ptr() != chunk.data_ptr()
