"""The bounded greedy head (model/greedy_head.py) gives each row's greedy token and its logit exactly as the full
float32 LM head and row_max give them, bit for bit: ties, near-ties, NaN and huge rows included."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from pagedllm import LLM, SamplingParams
from pagedllm.model.cpu_kernels import load_greedy_head, load_packed_linear
from pagedllm.model.greedy_head import build_greedy_head
from pagedllm.model.layers import MergedLinear
from pagedllm.sample.sampler import row_max

K = 128
PANEL_ROW = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                             ctypes.c_void_p)


def _kernels():
    linear = load_packed_linear()
    if linear is None or linear.blocks is None or load_greedy_head() is None:
        pytest.skip("the greedy head needs the panel kernel with block formats and AVX512_VNNI")
    return linear


def _weight(kind: str, vocab: int, seed: int = 0, k: int = K) -> torch.Tensor:
    """A float32 head [vocab, k]: random, or through a GGUF quantization and back (as the loader reads one)."""
    rng = np.random.default_rng(seed)
    dense = rng.standard_normal((vocab, k), dtype=np.float32) * 0.05
    if kind == "F32":
        return torch.from_numpy(dense)
    qtype = GGMLQuantizationType[kind]
    return torch.from_numpy(np.array(dequantize(quantize(dense, qtype), qtype), dtype=np.float32))


def _head(weight: torch.Tensor) -> MergedLinear:
    head = MergedLinear(weight.shape[1], [weight.shape[0]])
    head.weight.data.copy_(weight)
    packed = head.pack_blocks() or head.pack_panels()
    assert packed
    return head


def _hidden(rows: int, seed: int = 1, k: int = K) -> torch.Tensor:
    """Final hidden states with a few large channels, as a final norm's weight makes them."""
    generator = torch.Generator().manual_seed(seed)
    gain = torch.ones(k)
    gain[[3, 40, 77]] = 30.0
    return torch.randn(rows, k, generator=generator) * gain


def _assert_as_row_max(head: MergedLinear, greedy, hidden: torch.Tensor) -> None:
    want_values, want_tokens = row_max(head(hidden))
    values, tokens = greedy(hidden)
    assert torch.equal(tokens, want_tokens)
    assert torch.equal(values.view(torch.int32), want_values.view(torch.int32))


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_1", "F32"])
def test_panel_row_gives_the_layers_columns_bit_for_bit(kind):
    linear = _kernels()
    head = _head(_weight(kind, 6 * linear.panel))
    assert head.in_blocks == (kind != "F32")
    x = _hidden(5)
    full = head(x)
    panel_row = PANEL_ROW(linear.panel_row)
    block_bytes = head.panel_weight.shape[2] if head.in_blocks else 0
    for row in range(x.shape[0]):
        for panel in range(6):
            out = torch.empty(linear.panel)
            panel_row(x[row].data_ptr(), head.panel_weight.data_ptr(), panel, K, block_bytes, out.data_ptr())
            assert torch.equal(out, full[row, panel * linear.panel:(panel + 1) * linear.panel])


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_1", "F32"])
@pytest.mark.parametrize("rows", [1, 2, 3, 8, 9, 61])
def test_tokens_and_logits_are_row_maxs(kind, rows):
    linear = _kernels()
    weight = _weight(kind, 40 * linear.panel)
    head = _head(weight)
    greedy = build_greedy_head(weight, head)
    assert (greedy.weight_errors.max() == 0) == (kind == "Q8_0")  # the int8 copy is a Q8_0 head's own blocks
    _assert_as_row_max(head, greedy, _hidden(rows))


def test_a_wide_hidden_size_gives_row_maxs_tokens():
    """4096 steps of k (the float32 sums round by up to 4096 u; the bound's slack grows with k)."""
    linear = _kernels()
    weight = _weight("Q8_0", 8 * linear.panel, k=4096)
    head = _head(weight)
    _assert_as_row_max(head, build_greedy_head(weight, head), _hidden(9, k=4096))


def test_ties_take_the_first_and_near_ties_are_computed_exactly():
    """Columns equal to another column in an earlier panel, or one float32 step from it: their logits tie or
    differ by a rounding, which no bound separates; the exact sums decide, as in the full head."""
    linear = _kernels()
    vocab = 20 * linear.panel
    weight = _weight("F32", vocab)
    twins = [(2, 7 * linear.panel + 5), (30, 15 * linear.panel), (linear.panel + 1, vocab - 1)]
    for i, (first, twin) in enumerate(twins):
        weight[twin] = weight[first]
        if i == 1:
            weight[twin, 9] = torch.nextafter(weight[first, 9], torch.tensor(1.0))
    head = _head(weight)
    greedy = build_greedy_head(weight, head)
    hidden = torch.cat([weight[[first for first, _ in twins]] * 50, _hidden(16)])
    _assert_as_row_max(head, greedy, hidden)
    assert greedy(hidden)[1][[0, 2]].tolist() == [twins[0][0], twins[2][0]]


def test_rows_with_nan_infinity_or_huge_values_are_computed_whole():
    linear = _kernels()
    weight = _weight("Q8_0", 12 * linear.panel)
    head = _head(weight)
    greedy = build_greedy_head(weight, head)
    hidden = _hidden(16)
    hidden[0, 5], hidden[1, 7], hidden[2] = float("nan"), float("inf"), 0.0
    hidden[3] *= 1e30
    _assert_as_row_max(head, greedy, hidden)  # NaN bits included
    assert greedy(hidden)[0][:2].isnan().all()


def test_heads_the_kernel_cannot_take_get_none():
    linear = _kernels()
    weight = _weight("F32", 4 * linear.panel)
    int8 = MergedLinear(K, [weight.shape[0]])
    int8.weight.data.copy_(weight)
    int8.quantize_int8()
    int8.pack_panels()
    assert build_greedy_head(weight, int8) is None
    broken = weight.clone()
    broken[3, 3] = float("inf")
    assert build_greedy_head(broken, _head(weight)) is None
    if linear.blocks_bf16 is not None:  # a 4-bit head whose products take bfloat16 inputs (dtype=bfloat16)
        q4 = _weight("Q4_1", 4 * linear.panel)
        rounding = MergedLinear(K, [q4.shape[0]])
        rounding.weight.data.copy_(q4)
        assert rounding.pack_blocks(bfloat16=True) and rounding.bfloat16_inputs
        assert build_greedy_head(q4, rounding) is None


def test_default_model_head_on_its_scaled_hidden_states(llm):
    """The default model's tied Q8_0 head over hidden states scaled by its final norm (its large channels)."""
    _kernels()
    model = llm.llm_engine.model_executor.worker.model_runner.model
    assert model.greedy_head is not None
    generator = torch.Generator().manual_seed(2)
    hidden = torch.randn(64, model.config.hidden_size, generator=generator) * model.norm.weight * 3
    want_values, want_tokens = row_max(model.compute_logits(hidden))
    values, tokens = model.greedy(hidden)
    assert torch.equal(tokens, want_tokens) and torch.equal(values, want_values)


def test_default_model_greedy_batches_as_the_sampler(llm):
    """Twenty greedy requests at once, whose steps take the bounded head where there is one, give the tokens of the
    same requests asking for logprobs, which the sampler takes from the full logits."""
    tokenizer = llm.get_tokenizer()
    topics = ["the sea", "a mountain", "bread", "a violin", "rain", "trains", "a library", "winter", "bees",
              "a lighthouse", "chess", "coffee", "the moon", "a garden", "rivers", "clocks", "a market", "snow",
              "kites", "a bridge"]
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": f"Write two sentences about {topic}."}],
                                             tokenize=False, add_generation_prompt=True) for topic in topics]
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    with_logprobs = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True, logprobs=0)
    bounded = llm.generate(prompts, greedy, use_tqdm=False)
    graphs = llm.llm_engine.model_executor.worker.model_runner.decode_graphs
    assert graphs.graphs[len(prompts)]._greedy_steps is not None
    full = llm.generate(prompts, with_logprobs, use_tqdm=False)
    assert [r.outputs[0].token_ids for r in bounded] == [r.outputs[0].token_ids for r in full]


def test_eager_greedy_steps_take_the_sampler_s_tokens(tiny_model_dir):
    """Without CPU graphs, steps whose rows all take the raw argmax take it from the model (its bounded head where
    this CPU builds one: the tiny model's float32 head is larger than its copy, so even one row takes it); the
    tokens equal those of the same requests asking for logprobs, sampled from the full logits."""
    llm = LLM(tiny_model_dir, num_gpu_blocks_override=128, enforce_eager=True)
    model = llm.llm_engine.model_executor.worker.model_runner.model
    assert (model.greedy_head is not None) == (load_greedy_head() is not None)
    prompts = [{"prompt_token_ids": list(range(10 + i, 30 + 3 * i))} for i in range(6)]
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    with_logprobs = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=0)
    tokens = [r.outputs[0].token_ids for r in llm.generate(prompts, greedy, use_tqdm=False)]
    assert tokens == [r.outputs[0].token_ids for r in llm.generate(prompts, with_logprobs, use_tqdm=False)]
