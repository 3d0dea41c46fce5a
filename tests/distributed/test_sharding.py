"""Tensor-parallel shard arithmetic and reading one rank's slice from a real safetensors file."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from brigade.distributed.sharding import (AttentionShard, attention_shard, padded_vocab_size, read_slice, shard_range,
                                          vocab_range)


def test_shard_ranges_cover_the_dimension():
    ranges = [shard_range(12, r, 3) for r in range(3)]
    assert ranges == [(0, 4), (4, 8), (8, 12)]
    with pytest.raises(ValueError, match="tensor_parallel_size 5 does not divide the 12 features"):
        shard_range(12, 0, 5)


def test_attention_heads_split_and_kv_heads_replicate():
    # SmolLM2-135M: 9 heads, 3 KV heads, tp 3 -> 3 query heads and 1 KV head each, no replication
    assert attention_shard(9, 3, 2, 3) == AttentionShard(3, 1, 6, 2, 1)
    # 8 heads, 2 KV heads, tp 4: each KV head on 2 ranks; rank r reads KV head r // 2
    shards = [attention_shard(8, 2, r, 4) for r in range(4)]
    assert [s.kv_head_start for s in shards] == [0, 0, 1, 1]
    assert all(s.num_heads == 2 and s.num_kv_heads == 1 and s.kv_replicas == 2 for s in shards)
    # every rank's query heads read the KV head that GQA pairs them with in the whole model
    for r, s in enumerate(shards):
        group = 8 // 2  # query heads per KV head
        assert {(s.q_head_start + i) // group for i in range(s.num_heads)} == {s.kv_head_start}
    with pytest.raises(ValueError, match="does not divide the 9 attention heads"):
        attention_shard(9, 3, 0, 2)
    with pytest.raises(ValueError, match="cannot be replicated evenly"):
        attention_shard(12, 4, 0, 6)


def test_vocab_is_padded_per_rank():
    assert padded_vocab_size(49152, 3) == 49152
    assert padded_vocab_size(100, 2) == 128
    assert [vocab_range(100, r, 2) for r in range(2)] == [(0, 64), (64, 128)]


def test_read_slice_reads_one_ranks_part(tmp_path):
    w = torch.randn(6, 4)
    path = tmp_path / "model.safetensors"
    save_file({"w": w}, str(path))
    with safe_open(str(path), framework="pt") as f:
        assert torch.equal(read_slice(f, "w", 0, 2, 4), w[2:4])
        assert torch.equal(read_slice(f, "w", 1, 1, 3), w[:, 1:3])
        assert torch.equal(read_slice(f, "w", None), w)
