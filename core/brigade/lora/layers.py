"""The LoRA delta inside a linear layer, for a batch mixing adapters (punica, S-LoRA).

Every adapted layer holds ``max_loras`` weight slots, stacked and zero-padded to the largest rank, and
all of them share one ``LoRABatch``: a one-hot ``[tokens, max_loras]`` mask saying which slot each token's
request uses (an all-zero row: no adapter). The delta of a step is then two dense GEMMs whatever the mix
of adapters,

    y += ((x @ A_all.T) * mask) @ B_all.T

which is ``scaling * B_s (A_s x)`` for each token's slot ``s``: slots a token does not use are multiplied
by zero. It costs ``max_loras`` times the FLOPs of a single adapter, which is small next to the base
GEMM for the ranks LoRA uses, and it has no data-dependent shapes, host syncs or per-slot loops, so a
captured CUDA graph stays valid: the mask and the slots are persistent buffers rewritten in place.
"""

from __future__ import annotations

import torch


class LoRABatch:
    """The step's token-to-slot assignment, shared by every LoRA layer of a model.

    Attributes:
        mask: [max_tokens, max_loras] in the model dtype, on the device; row t is one-hot at the slot of
            token t's adapter, or all zeros. Rows past the step's tokens are zero (a padded CUDA-graph batch
            reads them). Written in place only (graphs captured over it stay valid).
    """

    def __init__(self, max_tokens: int, max_loras: int, *, dtype: torch.dtype, device: torch.device):
        self.max_loras = max_loras
        self.mask = torch.zeros(max_tokens, max_loras, dtype=dtype, device=device)


class LoRALinear:
    """The adapter slots of one linear layer (plain, or merged like ``qkv_proj``) and the delta they add.

    Slot ``s`` of shard ``j`` (``q``, ``k``, ``v`` of a QKV layer, ``gate``, ``up`` of gate_up) uses rank rows
    ``[j * max_rank, j * max_rank + r)`` of the slot's ``R = num_shards * max_rank`` rows: A blocks are stacked,
    B is block-diagonal over the shards' output slices, so one product serves the merged layer.

    Under tensor parallelism the slots hold this rank's part of each adapter, as vLLM shards LoRA: a
    column-parallel layer (qkv, gate_up) keeps each shard's whole A and the rows of B for its own output slice
    (``output_starts``), so its delta is its slice of the full delta; a row-parallel layer (o_proj, down_proj)
    keeps A's columns for its input slice (``input_start``) and the whole B, so its delta is a partial sum that
    the layer's all-reduce completes with the base product.

    Attributes:
        lora_a: [max_loras * R, in_features]; ``lora_a.view(max_loras, R, in_features)`` are the stacked A.
        lora_b: [out_features, max_loras * R], holding ``scaling * B``; ``lora_b.view(out, max_loras, R)``.
    Both are in the model dtype on the device, zero where no adapter (or a smaller rank) fills them.
    """

    def __init__(self, input_size: int, output_sizes: list[int], batch: LoRABatch, *, max_rank: int,
                 dtype: torch.dtype, device: torch.device, input_start: int = 0,
                 output_starts: list[int] | None = None):
        """Args beyond the attributes: input_start, the first of the full in_features this layer holds (a
        row-parallel rank's slice; 0 otherwise); output_starts, per output shard, the first row of that
        projection's full out_features this layer holds (a column-parallel rank's slice; zeros otherwise)."""
        self.batch = batch
        self.input_start = input_start
        self.output_starts = list(output_starts) if output_starts is not None else [0] * len(output_sizes)
        self.input_size = input_size
        self.output_sizes = list(output_sizes)
        self.max_rank = max_rank
        self.slot_rank = len(output_sizes) * max_rank  # R
        total = batch.max_loras * self.slot_rank
        self.lora_a = torch.zeros(total, input_size, dtype=dtype, device=device)
        self.lora_b = torch.zeros(sum(output_sizes), total, dtype=dtype, device=device)

    def set_slot(self, slot: int, shards: list[tuple[torch.Tensor, torch.Tensor] | None], scaling: float) -> None:
        """Write one adapter's weights into ``slot`` (zeroing what it does not fill).

        Args:
            slot: in [0, max_loras).
            shards: per output shard, the adapter's whole ``(A [r, full_in], B [full_out_shard, r])`` in any
                float dtype, or None (that shard is not adapted); the rank's parts are taken here (see the class).
                ``r <= max_rank``.
            scaling: multiplies B (in float32 at least, before the cast to the model dtype).
        """
        self.clear_slot(slot)
        base, out_at = slot * self.slot_rank, 0
        for j, (size, pair) in enumerate(zip(self.output_sizes, shards)):
            if pair is not None:
                a, b = pair
                a = a[:, self.input_start:self.input_start + self.input_size]
                b = b[self.output_starts[j]:self.output_starts[j] + size]
                r = a.shape[0]
                lo = base + j * self.max_rank
                self.lora_a[lo:lo + r].copy_(a)
                self.lora_b[out_at:out_at + size, lo:lo + r].copy_(
                    b.to(torch.promote_types(b.dtype, torch.float32)) * scaling)
            out_at += size

    def clear_slot(self, slot: int) -> None:
        lo, hi = slot * self.slot_rank, (slot + 1) * self.slot_rank
        self.lora_a[lo:hi].zero_()
        self.lora_b[:, lo:hi].zero_()

    def apply(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``out + delta``: each row of ``x`` through its token's slot (rows with no slot get nothing).

        Args: x [T, in_features] and out [T, out_features] (the base product), model dtype; T at most the
        batch mask's rows. Returns a new [T, out_features] tensor.
        """
        num_tokens = x.shape[0]
        slots, rank = self.batch.max_loras, self.slot_rank
        xa = x @ self.lora_a.t()  # [T, slots * R]
        xa = (xa.view(num_tokens, slots, rank) * self.batch.mask[:num_tokens, :, None]).view(num_tokens, -1)
        return torch.addmm(out, xa, self.lora_b.t())
