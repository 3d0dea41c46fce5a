"""The reference attention backend: plain PyTorch over the paged KV cache.

It is the CPU path and the correctness oracle for the fast kernels. A step's requests take one of three
routes, each a few batched PyTorch calls per layer rather than one per request:

- **decode** (one query token): the blocks named by the block tables are gathered whole with one
  ``index_select`` and each KV head's ``G = num_heads / num_kv_heads`` query heads attend as ``G`` query rows
  of one scaled-dot-product call, masked past each request's length (no GQA expansion of K/V);
- **fresh prefill** (no context in the cache yet): the step's own K/V are used directly, causally, one call
  per group of equal-length prompts; nothing is read back from the cache;
- **prefill with context** (chunked prefill, prefix-cache hits): the general route, which reads every
  request's context through its block table into a padded batch with a causal mask.

Every route takes the attention variants (``brigade.attention.variants``): a sliding window narrows its mask,
a soft cap or sinks move it from SDPA to explicit fp32 scores.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from brigade.attention.backend import AttentionBackend, AttentionMetadata
from brigade.attention.fp8_kv import dequantize_kv, is_fp8_kv, quantize_kv, round_trip_kv
from brigade.attention.variants import attend, causal_mask


def write_kv_cache(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                   slot_mapping: torch.Tensor, k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """Scatter new K/V rows into the paged cache.

    Args:
        key, value: [num_tokens, num_kv_heads, head_size]
        kv_cache: [2, num_blocks, block_size, num_kv_heads, head_size], written in place; in float8 e4m3 the
            rows are stored quantized with ``k_scale``/``v_scale`` (``fp8_kv.quantize_kv``), which are
            otherwise unused.
        slot_mapping: [num_tokens] int64 flat slots; rows with slot -1 are skipped (padding).
    """
    num_tokens = slot_mapping.shape[0]
    flat = kv_cache.view(2, -1, kv_cache.shape[-2], kv_cache.shape[-1])  # [2, num_slots, Hkv, D]
    if is_fp8_kv(kv_cache):  # PyTorch's CPU copies take no float8: the quantized rows move as bytes
        key = quantize_kv(key[:num_tokens], k_scale).view(torch.uint8)
        value = quantize_kv(value[:num_tokens], v_scale).view(torch.uint8)
        flat = flat.view(torch.uint8)
    valid = slot_mapping >= 0
    if bool(valid.all()):
        flat[0].index_copy_(0, slot_mapping, key[:num_tokens].to(flat.dtype))
        flat[1].index_copy_(0, slot_mapping, value[:num_tokens].to(flat.dtype))
    else:
        slots = slot_mapping[valid]
        flat[0].index_copy_(0, slots, key[:num_tokens][valid].to(flat.dtype))
        flat[1].index_copy_(0, slots, value[:num_tokens][valid].to(flat.dtype))


def _as_bytes(kv_cache: torch.Tensor) -> torch.Tensor:
    """A float8 cache as its bytes (PyTorch's CPU gathers take no float8), any other as it is."""
    return kv_cache.view(torch.uint8) if is_fp8_kv(kv_cache) else kv_cache


def gather_context(kv_cache: torch.Tensor, block_table: torch.Tensor, seq_lens_cpu: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Read every request's K/V context out of the paged cache into a padded batch.

    Returns:
        keys, values: [num_reqs, max_seq_len, num_kv_heads, head_size]
        valid: [num_reqs, max_seq_len] bool, True where position < seq_len.
    """
    block_size = kv_cache.shape[2]
    max_seq_len = int(seq_lens_cpu.max())
    device = kv_cache.device
    positions = torch.arange(max_seq_len, device=device)  # [S]
    num_blocks_needed = (max_seq_len + block_size - 1) // block_size
    blocks = block_table[:, :num_blocks_needed].long()  # [R, nb]
    slots = blocks[:, positions // block_size] * block_size + positions % block_size  # [R, S]
    valid = positions[None, :] < seq_lens_cpu.to(device)[:, None]
    slots = torch.where(valid, slots, torch.zeros_like(slots))
    flat = _as_bytes(kv_cache).view(2, -1, kv_cache.shape[-2], kv_cache.shape[-1])
    return flat[0][slots].view(kv_cache.dtype), flat[1][slots].view(kv_cache.dtype), valid


def gather_blocks(kv_cache: torch.Tensor, block_table: torch.Tensor, num_blocks: int) -> torch.Tensor:
    """Copy the first ``num_blocks`` blocks of each request's table out of the cache, whole.

    Args:
        kv_cache: [2, total_blocks, block_size, num_kv_heads, head_size]
        block_table: [R, >= num_blocks] int32 block ids.

    Returns: [2, R, num_blocks * block_size, num_kv_heads, head_size]; positions past a request's length
    hold whatever its (or the null) block holds and must be masked by the caller.
    """
    two, total, block_size, num_kv_heads, head_size = kv_cache.shape
    ids = block_table[:, :num_blocks].reshape(-1).long()
    rows = torch.index_select(_as_bytes(kv_cache).view(two, total, -1), 1, ids)  # [2, R * nb, bs * Hkv * D]
    return rows.view(kv_cache.dtype).view(two, block_table.shape[0], num_blocks * block_size, num_kv_heads, head_size)


class ReferenceAttentionBackend(AttentionBackend):
    """Paged attention in plain PyTorch; any dtype, block size and head size, on any device; a float8 e4m3
    cache (``--kv-cache-dtype fp8``) is dequantized where it is read (correctness, not speed). Sliding windows,
    soft caps and sinks are masks and explicit scores over the same gathered K/V."""

    name = "reference"
    supports_fp8_kv_cache = True
    supports_sliding_window = True
    supports_logits_soft_cap = True
    supports_sinks = True

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                metadata: AttentionMetadata) -> torch.Tensor:
        n = metadata.num_actual_tokens
        write_kv_cache(key[:n], value[:n], kv_cache, metadata.slot_mapping[:n], self.k_scale, self.v_scale)
        if is_fp8_kv(kv_cache):  # fresh prefills attend to their own K/V as a read of the cache returns them
            key, value = round_trip_kv(key, self.k_scale), round_trip_kv(value, self.v_scale)
        out = torch.empty_like(query)
        num_reqs, num_decodes = metadata.num_reqs, metadata.num_decodes
        if num_decodes:
            out[:num_decodes] = self._decode(query[:num_decodes], kv_cache, metadata.block_table[:num_decodes],
                                             metadata.seq_lens_cpu[:num_decodes])
        if num_reqs == num_decodes:
            return out
        qsl = metadata.query_start_loc_cpu[: num_reqs + 1].tolist()
        seq_lens = metadata.seq_lens_cpu[:num_reqs].tolist()
        fresh: dict[int, list[int]] = {}  # prompt length -> requests whose whole prompt is in this step
        with_context: list[int] = []
        for i in range(num_decodes, num_reqs):
            length = qsl[i + 1] - qsl[i]
            if length == 0:  # a padding request (metadata.mixed_graph): nothing to attend
                continue
            if length == seq_lens[i]:
                fresh.setdefault(length, []).append(i)
            else:
                with_context.append(i)
        for length, reqs in fresh.items():
            rows = torch.tensor([qsl[i] for i in reqs], device=query.device)[:, None] \
                + torch.arange(length, device=query.device)[None, :]  # [Rg, L]
            q, k, v = (t[rows].transpose(1, 2) for t in (query, key, value))  # [Rg, heads, L, D]
            attn = self._attend_fresh(q, k.to(q.dtype), v.to(q.dtype))
            out[rows.view(-1)] = attn.transpose(1, 2).reshape(-1, self.num_heads, self.head_size)
        if with_context:
            self._prefill_with_context(query, kv_cache, metadata, with_context, qsl, out)
        return out

    @property
    def _plain_softmax(self) -> bool:
        """No soft cap and no sinks: SDPA computes the softmax (a window is only a mask)."""
        return self.logits_soft_cap is None and self.sinks is None

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``variants.attend`` with this layer's scale, soft cap and sinks. Shapes as there."""
        return attend(q, k, v, mask, self.scale, logits_soft_cap=self.logits_soft_cap, sinks=self.sinks)

    def _attend_fresh(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Whole prompts attending causally to themselves. q: [Rg, H, L, D]; k, v: [Rg, Hkv, L, D]."""
        if self.sliding_window is None and self._plain_softmax:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale,
                                                  enable_gqa=self.num_heads != self.num_kv_heads)
        pos = torch.arange(q.shape[2], device=q.device)
        return self._attend(q, k, v, causal_mask(pos[:, None], pos[None, :], self.sliding_window))

    def _read(self, keys: torch.Tensor, values: torch.Tensor, dtype: torch.dtype
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """Gathered cache rows as ``dtype``: dequantized with this layer's scales from a float8 cache."""
        if is_fp8_kv(keys):
            return dequantize_kv(keys, self.k_scale, dtype), dequantize_kv(values, self.v_scale, dtype)
        return keys.to(dtype), values.to(dtype)

    def _decode(self, query: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                seq_lens_cpu: torch.Tensor) -> torch.Tensor:
        """One query token per request. query: [R, H, D] -> [R, H, D]."""
        num_reqs = query.shape[0]
        block_size = kv_cache.shape[2]
        max_len = int(seq_lens_cpu.max())
        num_blocks = -(-max_len // block_size)
        kv = gather_blocks(kv_cache, block_table, num_blocks)  # [2, R, S, Hkv, D]
        k, v = self._read(kv[0], kv[1], query.dtype)
        k, v = k.transpose(1, 2), v.transpose(1, 2)  # [R, Hkv, S, D]
        group = self.num_heads // self.num_kv_heads
        # The query sits at position seq_len - 1: it sees every earlier key, or the window's last W.
        k_pos = torch.arange(num_blocks * block_size)
        valid = causal_mask(seq_lens_cpu[:, None] - 1, k_pos[None, :], self.sliding_window)
        valid = valid[:, None, None, :].to(query.device)  # [R, 1, 1, S]
        if not self._plain_softmax:
            attn = self._attend(query.view(num_reqs, self.num_heads, 1, self.head_size), k, v, valid)
            return attn.view(num_reqs, self.num_heads, self.head_size)
        # Query head h reads KV head h // group: the group's query heads become rows of one call.
        q = query.view(num_reqs, self.num_kv_heads, group, self.head_size)
        attn = F.scaled_dot_product_attention(q, k, v, attn_mask=valid, scale=self.scale)  # [R, Hkv, G, D]
        return attn.reshape(num_reqs, self.num_heads, self.head_size)

    def _prefill_with_context(self, query: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata,
                              reqs: list[int], qsl: list[int], out: torch.Tensor) -> None:
        """Requests whose step continues a context already in the cache: padded batch, causal mask."""
        device = query.device
        seq_lens = metadata.seq_lens_cpu[reqs]
        starts = torch.tensor([qsl[i] for i in reqs])
        query_lens = torch.tensor([qsl[i + 1] - qsl[i] for i in reqs])
        max_q = int(query_lens.max())
        keys, values, valid = gather_context(kv_cache, metadata.block_table[reqs], seq_lens)
        # Pad queries into [R, max_q, H, D]; token i of request r sits at row starts[r] + i.
        q_idx = torch.arange(max_q)
        rows = starts[:, None] + q_idx[None, :]  # [R, max_q]
        q_valid = q_idx[None, :] < query_lens[:, None]
        rows = torch.where(q_valid, rows, torch.zeros_like(rows)).to(device)
        q = query[rows]  # [R, max_q, H, D]
        # Causal mask: query i of a request sits at absolute position seq_len - query_len + i.
        q_pos = (seq_lens - query_lens)[:, None] + q_idx[None, :]  # [R, max_q]
        k_pos = torch.arange(keys.shape[1])
        mask = causal_mask(q_pos[:, :, None], k_pos[None, None, :], self.sliding_window)
        mask = mask & valid.cpu()[:, None, :]  # [R, max_q, S]
        keys, values = self._read(keys, values, query.dtype)
        k, v = keys.transpose(1, 2), values.transpose(1, 2)  # [R, Hkv, S, D]
        attn = self._attend(q.transpose(1, 2), k, v, mask[:, None].to(device))  # [R, H, max_q, D]
        attn = attn.transpose(1, 2)  # [R, max_q, H, D]
        q_valid = q_valid.to(device)
        out[rows[q_valid]] = attn[q_valid]
