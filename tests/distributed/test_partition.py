"""Which part of the model each rank holds, and which parallel sizes are refused at start."""
from __future__ import annotations

import types

import pytest

from pagedllm.distributed import KVCacheShape, ParallelRanks, local_kv_cache_shape, verify_parallel_sizes
from pagedllm.distributed.partition import VOCAB_PADDING, even_slice, kv_head_slice, layer_slice, vocab_slice
from pagedllm.model.source import resolve_model_source


@pytest.fixture(scope="module")
def default_config():
    return resolve_model_source(None).hf_config


def _config(heads: int, kv_heads: int, layers: int = 4, intermediate: int = 96) -> types.SimpleNamespace:
    return types.SimpleNamespace(num_attention_heads=heads, num_key_value_heads=kv_heads, num_hidden_layers=layers,
                                 intermediate_size=intermediate, hidden_size=heads * 16)


def test_default_model_refuses_tp2_naming_both_numbers(default_config):
    assert (default_config.num_attention_heads, default_config.num_key_value_heads) == (9, 3)
    with pytest.raises(ValueError) as error:
        verify_parallel_sizes(default_config, 2, 1)
    assert str(error.value) == "Total number of attention heads (9) must be divisible by tensor parallel size (2)."


def test_default_model_accepts_tp3_and_pp_up_to_its_layers(default_config):
    verify_parallel_sizes(default_config, 3, 1)
    verify_parallel_sizes(default_config, 3, 30)
    with pytest.raises(ValueError, match=r"Pipeline parallel size \(31\) must not exceed the number of hidden "
                                         r"layers \(30\)\."):
        verify_parallel_sizes(default_config, 1, 31)
    assert local_kv_cache_shape(default_config, ParallelRanks(2, 3, 1, 2)) == KVCacheShape(15, 1, 64)


@pytest.mark.parametrize("heads, kv_heads, tp, message", [
    (12, 3, 2, r"Total number of key-value heads \(3\) must be divisible by tensor parallel size \(2\)\."),
    (12, 3, 4, r"Tensor parallel size \(4\) must be a multiple of the total number of key-value heads \(3\)"),
    (6, 3, 3, None),
    (6, 1, 6, None),  # the one KV head replicated on every rank
    (12, 3, 6, None),  # each of 3 KV heads on 2 ranks
])
def test_kv_heads_split_or_replicate(heads, kv_heads, tp, message):
    config = _config(heads, kv_heads)
    if message is not None:
        with pytest.raises(ValueError, match=message):
            verify_parallel_sizes(config, tp, 1)
        return
    verify_parallel_sizes(config, tp, 1)
    group = heads // kv_heads
    for rank in range(tp):
        first_head, count = even_slice(heads, rank, tp)
        first_kv, kv_count = kv_head_slice(kv_heads, rank, tp)
        # Attention groups the local heads evenly over the local KV heads: each must be the KV head that query
        # head reads in the whole model.
        local_group = count // kv_count
        assert [first_kv + i // local_group for i in range(count)] == [
            (first_head + i) // group for i in range(count)]


def test_sizes_below_one_and_uneven_intermediate_are_refused():
    with pytest.raises(ValueError, match="tensor_parallel_size must be at least 1, got 0"):
        verify_parallel_sizes(_config(6, 3), 0, 1)
    with pytest.raises(ValueError, match="pipeline_parallel_size must be at least 1, got 0"):
        verify_parallel_sizes(_config(6, 3), 1, 0)
    with pytest.raises(ValueError, match=r"Intermediate size \(100\) must be divisible by tensor parallel size \(3\)"):
        verify_parallel_sizes(_config(6, 3, intermediate=100), 3, 1)


# vLLM's split: the remainder goes one layer each to the stages before the last, the latest first.
@pytest.mark.parametrize("layers, pp, counts", [
    (30, 2, [15, 15]), (3, 2, [2, 1]), (4, 3, [1, 2, 1]), (5, 3, [2, 2, 1]), (7, 4, [2, 2, 2, 1]), (5, 1, [5]),
])
def test_layers_split_over_stages_as_vllm_does(layers, pp, counts):
    slices = [layer_slice(layers, stage, pp) for stage in range(pp)]
    assert [count for _, count in slices] == counts
    assert [start for start, _ in slices] == [sum(counts[:stage]) for stage in range(pp)]


@pytest.mark.parametrize("vocab, tp", [(49152, 3), (1000, 3), (1000, 2), (100, 8), (1000, 1)])
def test_vocab_slices_tile_the_vocabulary_in_equal_padded_rows(vocab, tp):
    slices, rows = zip(*(vocab_slice(vocab, rank, tp) for rank in range(tp)))
    assert len(set(rows)) == 1
    if tp == 1:
        assert slices == ((0, vocab),) and rows[0] == vocab
    else:
        assert rows[0] % VOCAB_PADDING == 0
    covered = [i for start, count in slices for i in range(start, start + count)]
    assert covered == list(range(vocab))
    # Gathered side by side, rank r's row j is token r * rows + j.
    assert all(start == min(rank * rows[0], vocab) for rank, (start, _) in enumerate(slices))


def test_ranks_follow_vllms_layout():
    assert [ParallelRanks.from_rank(rank, 3, 2) for rank in (0, 2, 3, 5)] == [
        ParallelRanks(0, 3, 0, 2), ParallelRanks(2, 3, 0, 2), ParallelRanks(0, 3, 1, 2), ParallelRanks(2, 3, 1, 2)]
    ranks = ParallelRanks(1, 3, 1, 2)
    assert (ranks.rank, ranks.world_size, ranks.stage_ranks(1)) == (4, 6, [3, 4, 5])
    assert ranks.is_last_stage and not ranks.is_first_stage and not ranks.is_output_rank
    with pytest.raises(ValueError, match=r"tp_rank must be in \[0, tp_size=3\), got 3"):
        ParallelRanks(3, 3)
    with pytest.raises(ValueError, match=r"rank must be in \[0, world_size=6\), got 6"):
        ParallelRanks.from_rank(6, 3, 2)
