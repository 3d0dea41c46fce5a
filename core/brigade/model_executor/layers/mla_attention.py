"""Multi-head latent attention (MLA) over a paged latent cache, in plain PyTorch (the CPU path and the reference).

DeepSeek-V2 (arXiv:2405.04434, section 2.1) caches, per token and layer, one latent vector: the normalized
compressed KV ``c`` (``kv_lora_rank`` values) and the decoupled rotary key ``k_pe`` (``qk_rope_head_dim``
values, shared by every head). The up-projection ``kv_b_proj`` ([H * (nope + v), kv_lora_rank]) turns ``c`` into
each head's key part ``W_UK c`` and value ``W_UV c``. A step's requests take one of two routes (vLLM's MLA
split):

- **prefill** (more than one query token, with or without cached context): the context latents are read back
  through the block table and expanded to per-head keys and values, then attended causally;
- **decode** (one query token): the up-projections are absorbed instead (the paper's weight absorption): the
  query's key part becomes ``q_nope W_UK`` in latent space, attends over the latents directly, and the
  latent-space output goes through ``W_UV`` afterwards. Nothing per head is ever materialized for the context.

Both are exact rewrites of ``softmax(q . k * scale) v`` with ``k = [W_UK c, k_pe]`` and ``v = W_UV c``.
"""

from __future__ import annotations

import torch
from torch import nn

from brigade.attention.backend import AttentionContext, AttentionMetadata
from brigade.interfaces.kv_cache_spec import MLAAttentionSpec
from brigade.model_executor.layers.custom_op import CustomOp


def write_latent_cache(latent: torch.Tensor, cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Scatter the step's latents into the paged cache.

    Args:
        latent: [num_tokens, kv_lora_rank + rope_dim], the compressed KV then the rotated shared key.
        cache: [num_blocks, block_size, kv_lora_rank + rope_dim], written in place.
        slot_mapping: [num_tokens] int64 flat slots (``block_id * block_size + offset``); -1 rows are skipped.
    """
    flat = cache.view(-1, cache.shape[-1])  # [num_slots, latent]
    rows = latent[:slot_mapping.shape[0]]
    valid = slot_mapping >= 0
    if bool(valid.all()):
        flat.index_copy_(0, slot_mapping, rows.to(flat.dtype))
    else:
        flat.index_copy_(0, slot_mapping[valid], rows[valid].to(flat.dtype))


class LatentDecode(CustomOp):
    """Single-token queries in latent space attending over their requests' cached latents (op ``"mla_decode"``).

    ``forward(q_latent, q_pe, cache, block_table, seq_lens, scale, max_seq_len)``:

    Args:
        q_latent: [D, H, L], each head's key query moved into latent space (``q_nope W_UK``).
        q_pe: [D, H, R], each head's rotated query channels.
        cache: [num_blocks, block_size, L + R], the layer's latents (compressed KV then rotated key).
        block_table: [D, max_blocks] int32; seq_lens: [D] int32, each request's context, its new token included.
        scale: the softmax scale; max_seq_len: ``max(seq_lens)`` as a host int.

    Returns:
        [D, H, L] in q_latent's dtype: ``softmax(scale * (q_latent . c + q_pe . k_pe)) @ c`` per head.
    """

    op_name = "mla_decode"

    def forward_native(self, q_latent: torch.Tensor, q_pe: torch.Tensor, cache: torch.Tensor,
                       block_table: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                       max_seq_len: int) -> torch.Tensor:
        num_decodes, block_size, rank = q_latent.shape[0], cache.shape[1], q_latent.shape[-1]
        num_blocks = -(-max_seq_len // block_size)
        blocks = block_table[:, :num_blocks].long()  # [D, nb]
        context = cache[blocks].reshape(num_decodes, num_blocks * block_size, -1).to(q_latent.dtype)  # [D, S, L+R]
        c, k_pe = context[..., :rank], context[..., rank:]
        scores = (torch.einsum("dhl,dsl->dhs", q_latent, c)
                  + torch.einsum("dhr,dsr->dhs", q_pe, k_pe)).float() * scale  # [D, H, S]
        past_end = torch.arange(num_blocks * block_size, device=c.device)[None, :] >= seq_lens[:, None]  # [D, S]
        scores.masked_fill_(past_end[:, None, :], float("-inf"))
        probs = torch.softmax(scores, dim=-1).to(q_latent.dtype)
        return torch.einsum("dhs,dsl->dhl", probs, c)


class MLAAttention(nn.Module):
    """Causal latent attention of ``num_heads`` query heads over one shared latent per token.

    Invariant: the layer's cache is ``ctx.kv_caches[layer_idx]`` of shape ``[num_blocks, block_size,
    kv_lora_rank + qk_rope_head_dim]`` (``MLAAttentionSpec.tensor_shape``), the same on every tensor-parallel rank
    (each rank holds ``num_heads`` of the model's heads and the whole latent).
    """

    def __init__(self, num_heads: int, qk_nope_head_dim: int, qk_rope_head_dim: int, v_head_dim: int,
                 kv_lora_rank: int, *, scale: float, layer_idx: int):
        """Args: this rank's query heads and the MLA widths (the HF config's names); ``scale`` the factor on
        ``q . k``; ``layer_idx`` the model's layer index (picks its cache and metadata)."""
        super().__init__()
        self.num_heads = num_heads
        self.qk_nope_head_dim = qk_nope_head_dim
        self.qk_rope_head_dim = qk_rope_head_dim
        self.v_head_dim = v_head_dim
        self.kv_lora_rank = kv_lora_rank
        self.scale = scale
        self.layer_idx = layer_idx
        self.decode = LatentDecode()

    def kv_cache_spec(self, block_size: int, cache_dtype: torch.dtype) -> MLAAttentionSpec:
        """One latent of ``kv_lora_rank + qk_rope_head_dim`` values per token."""
        dtype = str(cache_dtype).removeprefix("torch.")
        return MLAAttentionSpec(block_size, 1, self.kv_lora_rank + self.qk_rope_head_dim, dtype)

    def forward(self, q: torch.Tensor, latent: torch.Tensor, kv_b_weight: torch.Tensor,
                ctx: AttentionContext) -> torch.Tensor:
        """Write the step's latents, then attend every request over its context.

        Args:
            q: [T, num_heads, nope + rope], the rope part already rotated.
            latent: [T, kv_lora_rank + rope], the normalized compressed KV then the rotated shared key.
            kv_b_weight: [num_heads * (nope + v), kv_lora_rank], this rank's heads of ``kv_b_proj``.
            ctx: the step's metadata and every layer's cache.

        Returns:
            [T, num_heads * v_head_dim] in q's dtype; rows past ``num_actual_tokens`` are zero.
        """
        cache = ctx.kv_caches[self.layer_idx]
        metadata = ctx.metadata_for(self.layer_idx)
        write_latent_cache(latent, cache, metadata.slot_mapping)
        w_kv = kv_b_weight.view(self.num_heads, self.qk_nope_head_dim + self.v_head_dim, self.kv_lora_rank)
        out = q.new_zeros(q.shape[0], self.num_heads, self.v_head_dim)
        num_decodes = metadata.num_decodes
        if num_decodes:
            out[:num_decodes] = self._decode(q[:num_decodes], cache, metadata, w_kv)
        starts = metadata.query_start_loc_cpu.tolist()
        seq_lens = metadata.seq_lens_cpu.tolist()
        for r in range(num_decodes, metadata.num_reqs):
            if starts[r + 1] > starts[r]:
                out[starts[r]:starts[r + 1]] = self._prefill(q[starts[r]:starts[r + 1]], cache, metadata, r,
                                                             seq_lens[r], w_kv)
        return out.reshape(q.shape[0], self.num_heads * self.v_head_dim)

    def _prefill(self, q: torch.Tensor, cache: torch.Tensor, metadata: AttentionMetadata, r: int, seq_len: int,
                 w_kv: torch.Tensor) -> torch.Tensor:
        """Request ``r``'s ``Q`` query tokens (its last ones, of ``seq_len``) over its whole context, latents
        expanded to keys and values. q [Q, H, nope + rope] -> [Q, H, v]."""
        block_size, nope = cache.shape[1], self.qk_nope_head_dim
        positions = torch.arange(seq_len, device=q.device)
        slots = metadata.block_table[r, positions // block_size].long() * block_size + positions % block_size
        context = cache.view(-1, cache.shape[-1]).index_select(0, slots).to(q.dtype)  # [S, L + R]
        c, k_pe = context[:, :self.kv_lora_rank], context[:, self.kv_lora_rank:]
        kv = torch.einsum("sl,hdl->shd", c, w_kv)  # [S, H, nope + v]
        k_nope, v = kv[..., :nope], kv[..., nope:]
        scores = (torch.einsum("qhd,shd->hqs", q[..., :nope], k_nope)
                  + torch.einsum("qhr,sr->hqs", q[..., nope:], k_pe)).float() * self.scale  # [H, Q, S]
        num_queries = q.shape[0]
        query_pos = torch.arange(seq_len - num_queries, seq_len, device=q.device)
        scores.masked_fill_(positions[None, :] > query_pos[:, None], float("-inf"))
        probs = torch.softmax(scores, dim=-1).to(q.dtype)
        return torch.einsum("hqs,shv->qhv", probs, v)

    def _decode(self, q: torch.Tensor, cache: torch.Tensor, metadata: AttentionMetadata,
                w_kv: torch.Tensor) -> torch.Tensor:
        """The first ``D`` requests' single query tokens, with ``W_UK`` absorbed into the query and ``W_UV``
        applied after attending over the latents (``LatentDecode``). q [D, H, nope + rope] -> [D, H, v]."""
        num_decodes, nope = q.shape[0], self.qk_nope_head_dim
        q_latent = torch.einsum("dhn,hnl->dhl", q[..., :nope], w_kv[:, :nope])  # [D, H, L]
        max_seq_len = int(metadata.seq_lens_cpu[:num_decodes].max())
        out_latent = self.decode(q_latent, q[..., nope:], cache, metadata.block_table[:num_decodes],
                                 metadata.seq_lens[:num_decodes], self.scale, max_seq_len)  # [D, H, L]
        return torch.einsum("dhl,hvl->dhv", out_latent, w_kv[:, nope:])

    def extra_repr(self) -> str:
        return (f"layer={self.layer_idx}, heads={self.num_heads}, nope={self.qk_nope_head_dim}, "
                f"rope={self.qk_rope_head_dim}, v={self.v_head_dim}, kv_lora_rank={self.kv_lora_rank}")
