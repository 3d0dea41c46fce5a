"""The GPTQ tensor format: packing of ``qweight`` / ``qzeros`` into int32 words, and dequantization.

Format (AutoGPTQ's ``QuantLinear.pack``, kept by GPTQModel and read by vLLM; the quantizer is Frantar et al.,
"GPTQ: Accurate Post-Training Quantization for Generative Pre-trained Transformers", 2022, arXiv:2210.17323).
For a linear layer ``y = x @ W.T`` with ``W`` [out, in], ``bits`` in {4, 8} and ``pack = 32 // bits``:

* ``qweight`` int32 [in / pack, out]: the integer codes ``q[k, n]`` in [0, 2**bits - 1], transposed (input
  dimension first) and packed along the **input** dimension, little end first: word ``qweight[r, n]`` holds
  ``q[r * pack + j, n]`` in bits ``[bits * j, bits * (j + 1))``.
* ``qzeros`` int32 [groups, out / pack]: each group's zero point per output column, packed along the
  **output** dimension the same way (word ``qzeros[g, c]`` holds column ``c * pack + j`` in its ``j``-th slot).
* ``scales`` float16 [groups, out]: each group's step per output column.
* ``g_idx`` int32 [in]: the group of every input row. ``k // group_size`` unless the checkpoint was
  quantized with ``desc_act`` (act-order: rows were quantized in order of decreasing Hessian diagonal, so a
  group's rows are scattered and ``g_idx`` is a permuted assignment). ``groups = ceil(in / group_size)``
  (AutoGPTQ's rule; the last group may be short), 1 when ``group_size`` is -1.

The weight is ``W.T[k, n] = (q[k, n] - zero[g_idx[k], n]) * scales[g_idx[k], n]``, where
``zero = stored + zero_offset``. AutoGPTQ's historic ("v1", ``checkpoint_format: "gptq"``) convention stores
``zero - 1`` (so the symmetric 4-bit zero 8 is stored as 7, and the word is 0x77777777), hence
``zero_offset = 1``; the unpacked field is **not** wrapped, so a stored 15 means zero 16, as AutoGPTQ's and
vLLM's kernels compute it. GPTQModel's ``checkpoint_format: "gptq_v2"`` stores the zero itself
(``zero_offset = 0``).
"""

from __future__ import annotations

import torch

SUPPORTED_BITS = (4, 8)

# One dequantized column block of at most this many bytes at a time (``dequantize`` callers chunk with it),
# so the transient matrix of a wide layer stays small next to the packed weight it comes from.
DEQUANT_CHUNK_BYTES = 32 << 20


def pack_factor(bits: int) -> int:
    """Codes per int32 word: 8 at 4 bits, 4 at 8 bits. Raises ValueError for other widths."""
    if bits not in SUPPORTED_BITS:
        raise ValueError(f"GPTQ {bits}-bit is not supported; supported widths: "
                         f"{', '.join(map(str, SUPPORTED_BITS))}")
    return 32 // bits


def _shifts(bits: int, device: torch.device) -> torch.Tensor:
    return torch.arange(0, 32, bits, dtype=torch.int32, device=device)  # [pack]


def pack_rows(q: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack codes along dimension 0 (``qweight``): [in, out] integers in [0, 2**bits) -> int32 [in / pack, out].

    Raises:
        ValueError: unsupported ``bits``, ``in`` not a multiple of ``pack``, or a code out of range.
    """
    pack = pack_factor(bits)
    if q.dim() != 2 or q.shape[0] % pack:
        raise ValueError(f"cannot pack {tuple(q.shape)} codes along dim 0 by {pack}")
    wide = q if q.dtype == torch.int64 else q.to(torch.int32)  # no wrap before the range check
    if wide.numel():
        low, high = torch.aminmax(wide)
        if int(low) < 0 or int(high) >= 2 ** bits:
            raise ValueError(f"codes must lie in [0, {2 ** bits - 1}] for {bits}-bit packing")
    codes = wide.view(q.shape[0] // pack, pack, q.shape[1])
    words = codes[:, 0].to(torch.int64, copy=True)  # [in / pack, out], built in int64: no signed overflow
    for j in range(1, pack):
        words |= codes[:, j].to(torch.int64) << (bits * j)
    return torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32)  # the same 32 bits as int32


def unpack_rows(qweight: torch.Tensor, bits: int) -> torch.Tensor:
    """Inverse of ``pack_rows``: int32 [in / pack, out] -> int32 [in, out] codes in [0, 2**bits)."""
    pack = pack_factor(bits)
    codes = (qweight.unsqueeze(1) >> _shifts(bits, qweight.device)[None, :, None]) & (2 ** bits - 1)
    return codes.reshape(qweight.shape[0] * pack, qweight.shape[1])


def pack_cols(z: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack along dimension 1 (``qzeros``): [groups, out] integers in [0, 2**bits) -> int32 [groups, out / pack].

    Raises:
        ValueError: unsupported ``bits``, ``out`` not a multiple of ``pack``, or a value out of range.
    """
    pack = pack_factor(bits)
    if z.dim() != 2 or z.shape[1] % pack:
        raise ValueError(f"cannot pack {tuple(z.shape)} values along dim 1 by {pack}")
    return pack_rows(z.T.contiguous(), bits).T.contiguous()


def unpack_cols(qzeros: torch.Tensor, bits: int) -> torch.Tensor:
    """Inverse of ``pack_cols``: int32 [groups, out / pack] -> int32 [groups, out] in [0, 2**bits)."""
    pack = pack_factor(bits)
    codes = (qzeros.unsqueeze(2) >> _shifts(bits, qzeros.device)[None, None, :]) & (2 ** bits - 1)
    return codes.reshape(qzeros.shape[0], qzeros.shape[1] * pack)


def dequantize(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor, *,
               bits: int, zero_offset: int = 1, dtype: torch.dtype = torch.float32,
               columns: tuple[int, int] | None = None) -> torch.Tensor:
    """The transposed weight ``W.T`` [in, out] in ``dtype``: ``(q - (stored_zero + zero_offset)) * scale``.

    The product is computed in float32 (exact for the integer difference, one rounding for the multiply)
    and then cast to ``dtype`` once. This is the reference the Triton kernel is tested against.

    Args:
        qweight: int32 [in / pack, out]. qzeros: int32 [groups, out / pack]. scales: [groups, out] (float16
            in checkpoints; any float dtype). g_idx: int [in], each row's group, in [0, groups).
        bits: 4 or 8. zero_offset: 1 for AutoGPTQ's v1 zeros (``checkpoint_format: "gptq"``), 0 for "gptq_v2".
        dtype: result dtype.
        columns: ``(start, end)`` to dequantize only those output columns; both multiples of ``pack``
            (or ``end == out``). Default: all.

    Returns:
        [in, end - start] in ``dtype``, on qweight's device.
    """
    pack = pack_factor(bits)
    start, end = columns if columns is not None else (0, qweight.shape[1])
    q = unpack_rows(qweight[:, start:end], bits)  # [in, cols]
    zeros = unpack_cols(qzeros[:, start // pack:-(-end // pack)], bits)[:, :end - start]  # [groups, cols]
    g = g_idx.to(device=q.device, dtype=torch.long)
    # Gather each row's zero and scale: [in, cols]. Integer difference first, exactly.
    w = (q - zeros.index_select(0, g) - zero_offset).to(torch.float32)
    w.mul_(scales[:, start:end].index_select(0, g).to(torch.float32))
    return w.to(dtype)


def column_chunks(start: int, end: int, rows: int, *, pack: int,
                  budget_bytes: int = DEQUANT_CHUNK_BYTES) -> list[tuple[int, int]]:
    """Split output columns ``[start, end)`` into ranges whose float32 ``[rows, width]`` block fits
    ``budget_bytes`` (at least ``pack`` columns each); every boundary but ``end`` is a multiple of ``pack``."""
    width = max(pack, (budget_bytes // max(1, rows * 4)) // pack * pack)
    return [(c, min(c + width, end)) for c in range(start, end, width)]
