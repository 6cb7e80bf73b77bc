"""A draft model proposes by decoding greedily ahead of the target: a smaller model with the same tokenizer,
or the target's own weights quantized to int8 (the self-draft), whose greedy choices mostly agree with the
float model's at a third of its cost per token on CPU.

The self-draft (the target's own architecture) reads and writes the target's KV cache: every token but the
newest already has the target's float keys there, computed while verifying, so the draft never prefills a
prompt (the first token waits only for the draft's few decode steps) and proposes from better keys. It
feeds the newest token, then its own proposals, into the lookahead slots past the verified tokens; the next
verification writes those slots again before any query reads them (each layer writes a step's keys before
attending), and no other request reads them (a block is shared only once full and verified).

Another draft model keeps a KV cache of its own laid out block for block like the target's: a request's draft
keys sit in the same block ids and slots as its target keys, so the scheduler's block tables serve both, and
the lookahead slots hold the keys of its proposals. Per request the proposer remembers which tokens its cache
holds and in which blocks; after a step it feeds only what is new (the accepted tokens; more after a
preemption or a block change), then decodes the rest. Under tensor or pipeline parallelism the self-draft
does the same (the target's cache there holds only a shard).
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Iterable, Optional

import torch
from torch import nn

from pagedllm.config import EngineConfig, ModelConfig
from pagedllm.distributed.partition import local_kv_cache_shape
from pagedllm.distributed.ranks import ParallelRanks
from pagedllm.model.attention import allocate_kv_cache
from pagedllm.model.layers import linear_weight_bytes
from pagedllm.model.loader import load_model
from pagedllm.spec_decode.proposer import DraftContext, Proposer
from pagedllm.worker.batch import build_model_input
from pagedllm.worker.cpu_graph import DecodeGraphs, DecodeRow
from pagedllm.worker.sleep import OffloadedWeights, release_free_memory

logger = logging.getLogger(__name__)

# A feed of at most this many new tokens runs as decode rows (the C decode kernel, CPU graphs); a longer one
# (the prompt, after a prefill) as a prefill.
_MAX_DECODE_ROWS = 8


def draft_model_config(target: ModelConfig, config: EngineConfig) -> ModelConfig:
    """The draft's model config: another model's files, or the target's own, with the draft's quantization."""
    spec = config.speculative_config
    if spec.model is None:
        return dataclasses.replace(target, quantization=spec.quantization)
    from pagedllm.model.source import resolve_model_source

    source = resolve_model_source(spec.model)
    return dataclasses.replace(target, model=spec.model, path=source.path, format=source.format,
                               hf_config=source.hf_config, quantization=spec.quantization)


def warn_unless_cheaper(draft: nn.Module, target: nn.Module) -> None:
    """Warns where the draft's weights take as many bytes as the target's or more: a decode step reads them all,
    so each proposed token then costs about a target step, and speculation slows decoding down. The int8
    self-draft of a GGUF file whose weights stream as 4-bit blocks is such a draft."""
    draft_bytes, target_bytes = linear_weight_bytes(draft), linear_weight_bytes(target)
    if draft_bytes >= target_bytes:
        logger.warning("The draft model's weights take %.0f MB, the target's %.0f MB: each draft step reads at "
                       "least as much as a target step, so speculative decoding with this draft is likely slower "
                       "than plain decoding.", draft_bytes / 1e6, target_bytes / 1e6)


class _Feed:
    """One request's tokens as the draft sees them: what its cache holds, what it is fed next."""

    def __init__(self, request_id: str, tokens: list[int], num_computed: int, block_ids: list[int],
                 num_wanted: int) -> None:
        self.request_id = request_id
        self.tokens = tokens
        self.num_computed_tokens = num_computed
        self.block_ids = block_ids
        self.num_wanted = num_wanted
        self.proposed: list[int] = []
        self.all_token_ids: list[int] = tokens
        self.spec_token_ids: list[int] = []
        self.prompt_embeds = None  # the draft reads token ids only; verification keeps the output exact

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    def layout(self) -> int:
        """Split the uncomputed tokens as the batch layout reads them; returns how many are fed."""
        num_new = len(self.tokens) - self.num_computed_tokens
        split = self.num_computed_tokens + 1 if 0 < self.num_computed_tokens and num_new <= _MAX_DECODE_ROWS \
            else len(self.tokens)
        self.all_token_ids, self.spec_token_ids = self.tokens[:split], self.tokens[split:]
        return num_new

    def advance(self, token: int) -> None:
        self.num_computed_tokens = len(self.tokens)
        self.tokens = self.tokens + [token]
        self.proposed.append(token)


class DraftModelProposer(Proposer):
    def __init__(self, config: EngineConfig, device: torch.device, share_target_cache: bool = False) -> None:
        self.config = config
        self.share_target_cache = share_target_cache
        self.model_config = draft_model_config(config.model_config, config)
        self.device = device
        self.model = load_model(self.model_config, str(device))
        self.block_size = config.cache_config.block_size
        self.max_model_len = config.model_config.max_model_len
        self.kv_caches: list = []
        self.graphs: Optional[DecodeGraphs] = None
        self.offloaded: Optional[OffloadedWeights] = None  # sleep level 1's copy of the weights
        # Request id -> the tokens whose keys the draft cache holds, and the blocks they are in.
        self.cached: dict[str, tuple[list[int], list[int]]] = {}

    def block_bytes(self) -> int:
        if self.share_target_cache:
            return 0
        shape = local_kv_cache_shape(self.model_config.hf_config, ParallelRanks())
        element = torch.tensor([], dtype=self.model_config.activation_dtype).element_size()
        return 2 * shape.num_layers * self.block_size * shape.num_kv_heads * shape.head_dim * element

    def initialize_cache(self, num_blocks: int, target_kv_caches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        shape = local_kv_cache_shape(self.model_config.hf_config, ParallelRanks())
        self.kv_caches = target_kv_caches if self.share_target_cache else [
            allocate_kv_cache(num_blocks, self.block_size, shape.num_kv_heads, shape.head_dim,
                              self.model_config.activation_dtype,
                              self.device) for _ in range(shape.num_layers)]
        self._reset_graphs()

    def _reset_graphs(self) -> None:
        """New CPU graphs (recorded on first use) once both the weights and the cache are in place: graphs hold
        pointers into both."""
        self.graphs = None
        if (self.model is not None and self.kv_caches and self.device.type == "cpu"
                and self.model_config.activation_dtype == torch.float32 and not self.model_config.enforce_eager):
            self.graphs = DecodeGraphs(self.model, self.kv_caches, self.max_model_len, self.block_size)

    def release_cache(self) -> None:
        self.kv_caches, self.graphs = [], None
        self.cached.clear()

    def release_weights(self, level: int) -> None:
        self.graphs = None
        if level == 1:
            self.offloaded = OffloadedWeights(self.model)
        else:
            self.model = None
            release_free_memory()

    def restore_weights(self) -> None:
        if self.offloaded is not None:
            self.offloaded.restore()
            self.offloaded = None
        else:
            self.model = load_model(self.model_config, str(self.device))
        self._reset_graphs()

    def forget(self, request_ids: Iterable[str]) -> None:
        for request_id in request_ids:
            self.cached.pop(request_id, None)

    def propose(self, contexts: list[DraftContext], num_tokens: int) -> dict[str, list[int]]:
        feeds = [_Feed(request.request_id, tokens, self._num_cached(request.request_id, tokens, request.block_ids),
                       request.block_ids, min(num_tokens, self.max_model_len - len(tokens)))
                 for request, tokens in contexts]
        active = [feed for feed in feeds if feed.num_wanted > 0]
        while active:
            for feed, token in zip(active, self._next_tokens(active)):
                feed.advance(token)
            active = [feed for feed in active if len(feed.proposed) < feed.num_wanted]
        if not self.share_target_cache:
            for feed in feeds:
                # The last proposal was never fed: the cache holds the tokens before it.
                held = feed.tokens[:-1] if feed.proposed else feed.tokens[:feed.num_computed_tokens]
                self.cached[feed.request_id] = (held, list(feed.block_ids))
        return {feed.request_id: feed.proposed for feed in feeds if feed.proposed}

    def _num_cached(self, request_id: str, tokens: list[int], block_ids: list[int]) -> int:
        """Leading tokens whose draft keys are still valid: the same tokens in the same blocks (always leaving
        one token to feed). Blocks past the accepted tokens are freed after a step, so the last blocks may
        differ."""
        if self.share_target_cache:
            return len(tokens) - 1  # the target verified all but the newest
        held = self.cached.get(request_id)
        if held is None:
            return 0
        held_tokens, held_blocks = held
        same_blocks = 0
        while (same_blocks < min(len(held_blocks), len(block_ids))
               and held_blocks[same_blocks] == block_ids[same_blocks]):
            same_blocks += 1
        same = 0
        limit = min(len(held_tokens), len(tokens) - 1, same_blocks * self.block_size)
        while same < limit and held_tokens[same] == tokens[same]:
            same += 1
        return same

    @torch.inference_mode()
    def _next_tokens(self, feeds: list[_Feed]) -> list[int]:
        """One forward pass of the draft over each feed's new tokens: its greedy next token, in `feeds` order."""
        hidden = self._decode_rows(feeds)
        if hidden is not None:  # one row per feed, in order, from a CPU graph
            greedy = self.graphs.greedy()
            return greedy[1].tolist() if greedy is not None else self._greedy(hidden)
        batch = build_model_input([(feed, feed.layout()) for feed in feeds], self.block_size, self.device)
        hidden = self.graphs.forward(batch) if self.graphs is not None else None
        if hidden is None:
            hidden = self.model.forward_stage(batch.input_ids, batch.positions, self.kv_caches, batch.attn_metadata)
        last = torch.tensor([start + n - 1 for start, n in zip(batch.query_starts, batch.num_new_tokens)],
                            device=self.device)
        tokens = dict(zip((feed.request_id for feed in batch.requests), self._greedy(hidden[last])))
        return [tokens[feed.request_id] for feed in feeds]

    def _decode_rows(self, feeds: list[_Feed]) -> Optional[torch.Tensor]:
        """The final hidden states of feeds that each feed one token after cached ones (every step of the
        self-draft, and the draft's own steps after the first), from a CPU graph with its inputs written
        directly: laying out a batch for each token cost more than the graph's dispatch. None where a feed has
        more to feed or no graph takes the rows."""
        if self.graphs is None or any(len(feed.tokens) - feed.num_computed_tokens != 1 or not feed.num_computed_tokens
                                      for feed in feeds):
            return None
        rows = [DecodeRow(feed.tokens[-1], feed.num_computed_tokens, feed.block_ids) for feed in feeds]
        return self.graphs.forward_rows(rows, self.block_size)

    def _greedy(self, hidden: torch.Tensor) -> list[int]:
        return self.model.greedy(hidden)[1].tolist()
