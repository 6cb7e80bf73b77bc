"""The Triton kernel behind triton_attention.py (which documents it); importing this module imports triton."""
import triton
import triton.language as tl


@triton.jit
def paged_attention_kernel(
        q_ptr, k_ptr, v_ptr, out_ptr, tables_ptr, tile_meta_ptr, scale,
        q_token_stride, q_head_stride, out_token_stride, out_head_stride,
        cache_head_stride, cache_block_stride, cache_slot_stride, table_stride,
        token_offset, num_tiles, block_size, dim, group,
        GROUP_PADDED: tl.constexpr, TILE_TOKENS: tl.constexpr, DIM_PADDED: tl.constexpr,
        BLOCK_N: tl.constexpr, DECODE: tl.constexpr, PRECISION: tl.constexpr):
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    # tile_meta: decode rows' context lengths [B], or prefill tiles [4, N] (see prefill_tiles)
    if DECODE:  # decode row `tile`: its own table row, one token, its context length
        row = tile
        first_token = token_offset + tile
        num_tokens = 1
        first_len = tl.load(tile_meta_ptr + tile).to(tl.int32)
    else:
        row = tl.load(tile_meta_ptr + tile)
        first_token = token_offset + tl.load(tile_meta_ptr + num_tiles + tile)
        num_tokens = tl.load(tile_meta_ptr + 2 * num_tiles + tile)
        first_len = tl.load(tile_meta_ptr + 3 * num_tiles + tile)
    # Rows of this program: token (r // GROUP_PADDED) of the tile, head (r % GROUP_PADDED) of the group.
    rows = tl.arange(0, TILE_TOKENS * GROUP_PADDED)
    token = rows // GROUP_PADDED
    head = kv_head * group + rows % GROUP_PADDED
    row_valid = (token < num_tokens) & (rows % GROUP_PADDED < group)
    row_len = first_len + token  # keys each row attends to, its own token's included
    cols = tl.arange(0, DIM_PADDED)
    col_valid = cols < dim
    q = tl.load(q_ptr + (first_token + token)[:, None] * q_token_stride + head[:, None] * q_head_stride
                + cols[None, :], mask=row_valid[:, None] & col_valid[None, :], other=0.0)
    max_score = tl.full([TILE_TOKENS * GROUP_PADDED], float("-inf"), tl.float32)
    total = tl.zeros([TILE_TOKENS * GROUP_PADDED], tl.float32)
    acc = tl.zeros([TILE_TOKENS * GROUP_PADDED, DIM_PADDED], tl.float32)
    num_keys = first_len + num_tokens - 1
    cache_head = kv_head.to(tl.int64) * cache_head_stride
    for key_start in range(0, num_keys, BLOCK_N):
        keys = key_start + tl.arange(0, BLOCK_N)
        key_valid = keys < num_keys
        block = tl.load(tables_ptr + row.to(tl.int64) * table_stride + keys // block_size, mask=key_valid,
                        other=0)
        offsets = (cache_head + block.to(tl.int64) * cache_block_stride
                   + (keys % block_size).to(tl.int64) * cache_slot_stride)
        kv_mask = key_valid[:, None] & col_valid[None, :]
        k = tl.load(k_ptr + offsets[:, None] + cols[None, :], mask=kv_mask, other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION).to(tl.float32) * scale
        scores = tl.where(keys[None, :] < row_len[:, None], scores, float("-inf"))
        new_max = tl.maximum(max_score, tl.max(scores, 1))
        correction = tl.exp(max_score - new_max)
        weights = tl.exp(scores - new_max[:, None])
        total = total * correction + tl.sum(weights, 1)
        v = tl.load(v_ptr + offsets[:, None] + cols[None, :], mask=kv_mask, other=0.0)
        acc = acc * correction[:, None] + tl.dot(weights.to(v.dtype), v, input_precision=PRECISION).to(tl.float32)
        max_score = new_max
    result = acc / total[:, None]
    tl.store(out_ptr + (first_token + token)[:, None] * out_token_stride + head[:, None] * out_head_stride
             + cols[None, :], result.to(out_ptr.dtype.element_ty),
             mask=row_valid[:, None] & col_valid[None, :])
