"""Which slice of each weight a tensor-parallel rank holds, and reading only that slice from a checkpoint.

Megatron-LM's scheme, as vLLM uses it: column-parallel layers (QKV, gate/up) split their output features, and
row-parallel layers (o_proj, down_proj) their input features, ending in an all-reduce; the embedding and the LM
head split the vocabulary. Attention heads split whole: rank ``r`` of ``tp`` owns query heads
``[r * H / tp, (r + 1) * H / tp)``. When ``tp`` exceeds the KV-head count, KV heads are replicated: each KV head is
held by ``tp / num_kv_heads`` consecutive ranks, so every rank still has the KV head its query heads read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def divide(numerator: int, denominator: int, what: str) -> int:
    """``numerator / denominator`` when it is whole.

    Raises:
        ValueError: naming ``what`` when ``denominator`` does not divide ``numerator``.
    """
    if numerator % denominator:
        raise ValueError(f"tensor_parallel_size {denominator} does not divide the {numerator} {what}")
    return numerator // denominator


def shard_range(size: int, rank: int, world_size: int, what: str = "features") -> tuple[int, int]:
    """``[start, end)`` of rank ``rank``'s equal share of ``size`` rows or columns.

    Raises:
        ValueError: ``world_size`` does not divide ``size``.
    """
    per_rank = divide(size, world_size, what)
    return rank * per_rank, (rank + 1) * per_rank


@dataclass(frozen=True, slots=True)
class AttentionShard:
    """One rank's attention heads under tensor parallelism."""

    num_heads: int  # query heads on this rank
    num_kv_heads: int  # KV heads on this rank (1 when replicated)
    q_head_start: int  # first query head it owns
    kv_head_start: int  # first KV head it owns (shared with its replicas)
    kv_replicas: int  # ranks holding each of its KV heads (1: no replication)


def attention_shard(num_heads: int, num_kv_heads: int, rank: int, tp: int) -> AttentionShard:
    """The heads rank ``rank`` of ``tp`` holds.

    Raises:
        ValueError: ``tp`` does not divide ``num_heads``, or neither divides the other for the KV heads.
    """
    q_per_rank = divide(num_heads, tp, "attention heads")
    if tp <= num_kv_heads:
        kv_per_rank = divide(num_kv_heads, tp, "KV heads")
        return AttentionShard(q_per_rank, kv_per_rank, rank * q_per_rank, rank * kv_per_rank, 1)
    if tp % num_kv_heads:
        raise ValueError(f"tensor_parallel_size {tp} is above the {num_kv_heads} KV heads and not a multiple of "
                         "them, so the KV heads cannot be replicated evenly")
    replicas = tp // num_kv_heads
    return AttentionShard(q_per_rank, 1, rank * q_per_rank, rank // replicas, replicas)


def padded_vocab_size(vocab_size: int, tp: int, pad_to: int = 64) -> int:
    """The vocabulary padded so each of ``tp`` ranks holds a whole number of ``pad_to`` rows (vLLM pads to 64)."""
    step = pad_to * tp
    return (vocab_size + step - 1) // step * step


def vocab_range(vocab_size: int, rank: int, tp: int) -> tuple[int, int]:
    """``[start, end)`` of the padded vocabulary rank ``rank`` holds; rows past ``vocab_size`` are padding."""
    return shard_range(padded_vocab_size(vocab_size, tp), rank, tp, "vocabulary rows")


def read_slice(handle, name: str, dim: int | None, start: int = 0, end: int | None = None) -> torch.Tensor:
    """Read rows or columns ``[start, end)`` along ``dim`` of one tensor from an open safetensors file.

    Only those bytes are read (``safe_open(...).get_slice``): no rank materialises a whole sharded tensor.

    Args:
        handle: the object ``safetensors.safe_open(path, framework="pt")`` returns.
        name: the tensor's name in the file.
        dim: the dimension to slice, or None for the whole tensor.
    Returns:
        The slice as a new CPU tensor in the file's dtype.
    """
    part = handle.get_slice(name)
    if dim is None:
        return part[:]
    shape = part.get_shape()
    end = shape[dim] if end is None else end
    index = tuple(slice(start, end) if d == dim else slice(None) for d in range(len(shape)))
    return part[index]


def pp_layer_range(num_layers: int, pp_rank: int, pp_size: int) -> tuple[int, int]:
    """``[start, end)`` of the decoder layers pipeline stage ``pp_rank`` of ``pp_size`` runs.

    vLLM's ``get_pp_indices``: ``num_layers // pp_size`` each, and the remainder one each to the stages before the
    last (the last also runs the final norm and the LM head), from the second-to-last backwards.

    Raises:
        ValueError: more stages than layers.
    """
    if pp_size > num_layers:
        raise ValueError(f"pipeline_parallel_size {pp_size} is above the {num_layers} layers")
    sizes = [num_layers // pp_size] * pp_size
    for i in range(2, num_layers % pp_size + 2):
        sizes[-i] += 1
    start = sum(sizes[:pp_rank])
    return start, start + sizes[pp_rank]
