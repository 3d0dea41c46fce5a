"""The reference attention backend: plain PyTorch over the paged KV cache (book ch. 5, 6).

It is the CPU path and the correctness oracle for the fast kernels. It gathers each request's context
through its block table into a padded batch and runs one masked scaled-dot-product attention, so a
step costs one kernel per layer rather than one per request.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from brigade.attention.backend import AttentionBackend, AttentionMetadata


def write_kv_cache(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                   slot_mapping: torch.Tensor) -> None:
    """Scatter new K/V rows into the paged cache.

    Args:
        key, value: [num_tokens, num_kv_heads, head_size]
        kv_cache: [2, num_blocks, block_size, num_kv_heads, head_size], written in place.
        slot_mapping: [num_tokens] int64 flat slots; rows with slot -1 are skipped (padding).
    """
    num_tokens = slot_mapping.shape[0]
    flat = kv_cache.view(2, -1, kv_cache.shape[-2], kv_cache.shape[-1])  # [2, num_slots, Hkv, D]
    valid = slot_mapping >= 0
    if bool(valid.all()):
        flat[0].index_copy_(0, slot_mapping, key[:num_tokens].to(flat.dtype))
        flat[1].index_copy_(0, slot_mapping, value[:num_tokens].to(flat.dtype))
    else:
        slots = slot_mapping[valid]
        flat[0].index_copy_(0, slots, key[:num_tokens][valid].to(flat.dtype))
        flat[1].index_copy_(0, slots, value[:num_tokens][valid].to(flat.dtype))


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
    flat = kv_cache.view(2, -1, kv_cache.shape[-2], kv_cache.shape[-1])
    return flat[0][slots], flat[1][slots], valid


class ReferenceAttentionBackend(AttentionBackend):
    """Paged attention in plain PyTorch; any dtype, block size and head size, on any device."""

    name = "reference"

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                metadata: AttentionMetadata) -> torch.Tensor:
        n = metadata.num_actual_tokens
        write_kv_cache(key[:n], value[:n], kv_cache, metadata.slot_mapping[:n])
        out = torch.zeros_like(query)
        qsl = metadata.query_start_loc_cpu.tolist()
        seq_lens = metadata.seq_lens_cpu[: metadata.num_reqs]
        query_lens = torch.tensor([qsl[i + 1] - qsl[i] for i in range(metadata.num_reqs)])
        num_reqs = metadata.num_reqs
        max_q = int(query_lens.max())
        device = query.device
        keys, values, valid = gather_context(kv_cache, metadata.block_table[:num_reqs], seq_lens)
        # Pad queries into [R, max_q, H, D]; token i of request r sits at row qsl[r] + i.
        q_idx = torch.arange(max_q)
        rows = torch.tensor(qsl[:-1])[:, None] + q_idx[None, :]  # [R, max_q]
        q_valid = q_idx[None, :] < query_lens[:, None]
        rows = torch.where(q_valid, rows, torch.zeros_like(rows)).to(device)
        q = query[rows]  # [R, max_q, H, D]
        # Causal mask: query i of a request sits at absolute position seq_len - query_len + i.
        q_pos = (seq_lens - query_lens)[:, None] + q_idx[None, :]  # [R, max_q]
        k_pos = torch.arange(keys.shape[1])
        mask = (k_pos[None, None, :] <= q_pos[:, :, None]) & valid.cpu()[:, None, :]  # [R, max_q, S]
        k = keys.transpose(1, 2).to(query.dtype)  # [R, Hkv, S, D]
        v = values.transpose(1, 2).to(query.dtype)
        attn = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask[:, None].to(device),
                                              scale=self.scale,
                                              enable_gqa=self.num_heads != self.num_kv_heads)  # [R, H, max_q, D]
        attn = attn.transpose(1, 2)  # [R, max_q, H, D]
        out[rows[q_valid.to(device)]] = attn[q_valid.to(device)]
        return out
