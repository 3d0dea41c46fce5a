"""Fixtures for model tests: tiny random-weight HF checkpoints and a paged-attention step builder.

``PagedSteps`` plays the model runner's part in miniature: it keeps each request's block table
(deliberately non-contiguous blocks) and context length, builds ``AttentionMetadata`` for a step
(decodes first, then prefills, as the metadata's invariant demands), and owns one KV cache per layer
filled with large random values, so reading a slot that was never written shows in the logits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch

from brigade.attention.backend import AttentionContext, AttentionMetadata
from brigade.attention.reference import ReferenceAttentionBackend


@dataclass
class PagedSteps:
    """Per-request block tables and context lengths across steps, plus the layers' KV caches."""

    num_layers: int
    num_kv_heads: int
    head_size: int
    block_size: int = 4
    num_blocks: int = 32
    dtype: torch.dtype = torch.float32
    block_tables: dict[str, list[int]] = field(default_factory=dict)
    num_computed: dict[str, int] = field(default_factory=dict)
    kv_caches: list[torch.Tensor] = field(default_factory=list)

    def __post_init__(self) -> None:
        gen = torch.Generator().manual_seed(1234)
        shape = ReferenceAttentionBackend.kv_cache_shape(self.num_blocks, self.block_size, self.num_kv_heads,
                                                          self.head_size)
        self.kv_caches = [(torch.randn(shape, generator=gen) * 100).to(self.dtype) for _ in range(self.num_layers)]

    def add_request(self, req_id: str, blocks: list[int]) -> None:
        self.block_tables[req_id] = list(blocks)
        self.num_computed[req_id] = 0

    def step(self, scheduled: list[tuple[str, list[int]]]) -> tuple[torch.Tensor, torch.Tensor, AttentionContext]:
        """Build one step's inputs for ``[(req_id, new_token_ids), ...]`` (decodes must come first).

        Returns (input_ids [T] int64, positions [T] int64, ctx) and advances each request's context.
        """
        query_lens = [len(tokens) for _, tokens in scheduled]
        num_decodes = 0
        while num_decodes < len(query_lens) and query_lens[num_decodes] == 1:
            num_decodes += 1
        assert all(q > 1 for q in query_lens[num_decodes:]), "decodes must come before prefills"
        input_ids, positions, slots, seq_lens = [], [], [], []
        for req_id, tokens in scheduled:
            start = self.num_computed[req_id]
            table = self.block_tables[req_id]
            for i, token in enumerate(tokens):
                pos = start + i
                input_ids.append(token)
                positions.append(pos)
                slots.append(table[pos // self.block_size] * self.block_size + pos % self.block_size)
            seq_lens.append(start + len(tokens))
            self.num_computed[req_id] = start + len(tokens)
        max_blocks = max(len(self.block_tables[r]) for r, _ in scheduled)
        block_table = torch.zeros(len(scheduled), max_blocks, dtype=torch.int32)
        for row, (req_id, _) in enumerate(scheduled):
            table = self.block_tables[req_id]
            block_table[row, : len(table)] = torch.tensor(table, dtype=torch.int32)
        qsl = torch.tensor([0] + query_lens, dtype=torch.int32).cumsum(0).to(torch.int32)
        seq = torch.tensor(seq_lens, dtype=torch.int32)
        metadata = AttentionMetadata(
            num_reqs=len(scheduled), num_actual_tokens=len(input_ids), max_query_len=max(query_lens),
            max_seq_len=max(seq_lens), num_decodes=num_decodes, query_start_loc=qsl, seq_lens=seq,
            block_table=block_table, slot_mapping=torch.tensor(slots, dtype=torch.int64),
            query_start_loc_cpu=qsl.clone(), seq_lens_cpu=seq.clone())
        ctx = AttentionContext(metadata=metadata, kv_caches=self.kv_caches)
        return torch.tensor(input_ids, dtype=torch.int64), torch.tensor(positions, dtype=torch.int64), ctx


def _save_random_hf_model(path: Path, config, seed: int = 0) -> Path:
    """Build a transformers model from ``config`` with random weights (biases too) and save it to ``path``."""
    import transformers

    torch.manual_seed(seed)
    model_cls = getattr(transformers, config.architectures[0])
    model = model_cls(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                # HF initializes biases to 0 and norms to 1; perturb them so their loading is tested.
                param.add_(torch.randn_like(param) * 0.1)
    model.save_pretrained(str(path))
    return path


@pytest.fixture
def save_random_hf_model():
    """``save_random_hf_model(path, hf_config, seed=0) -> path``: a random-weight HF checkpoint on disk."""
    return _save_random_hf_model


@pytest.fixture
def paged_steps_for():
    """Factory: ``paged_steps_for(hf_config, dtype)`` -> a fresh PagedSteps for that model shape."""

    def make(hf_config, dtype: torch.dtype = torch.float32) -> PagedSteps:
        head_size = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
        return PagedSteps(num_layers=hf_config.num_hidden_layers, num_kv_heads=hf_config.num_key_value_heads,
                          head_size=head_size, dtype=dtype)

    return make
