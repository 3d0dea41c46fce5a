"""The AWQ tensor format (AutoAWQ's ``WQLinear_GEMM``, read by vLLM's ``awq`` method): packing and dequantization.

AWQ is Lin et al., "AWQ: Activation-aware Weight Quantization for LLM Compression and Acceleration", 2023,
arXiv:2306.00978. For a linear layer ``y = x @ W.T`` with ``W`` [out, in], 4 bits and ``pack = 8``:

* ``qweight`` int32 [in, out / 8]: the codes ``q[k, n]`` in [0, 15], transposed (input dimension first) and
  packed along the **output** dimension in AutoAWQ's interleaved order: the ``i``-th nibble (bits
  ``[4 i, 4 i + 4)``) of word ``qweight[k, c]`` holds column ``c * 8 + AWQ_ORDER[i]``, with
  ``AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]``; unpacking takes nibble ``AWQ_REVERSE_ORDER[j]`` for column
  ``c * 8 + j`` (``AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]``, AutoAWQ's ``awq/utils/packing_utils.py``
  and vLLM's ``awq_triton.py``).
* ``qzeros`` int32 [in / group_size, out / 8]: each group's zero point per output column, packed the same way.
  Stored as is (no minus one, unlike GPTQ's v1 zeros).
* ``scales`` float16 [in / group_size, out].

The weight is ``W.T[k, n] = (q[k, n] - zero[k // group_size, n]) * scales[k // group_size, n]``.
"""

from __future__ import annotations

import torch

BITS = 4
PACK = 32 // BITS
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i holds column AWQ_ORDER[i] of its 8
AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)  # column j sits in nibble AWQ_REVERSE_ORDER[j]

# One dequantized column block of at most this many bytes at a time, as brigade-gptq.
DEQUANT_CHUNK_BYTES = 32 << 20


def _shifts(device: torch.device) -> torch.Tensor:
    # Shift of each column's nibble: column j of a word is in nibble AWQ_REVERSE_ORDER[j].
    return torch.tensor([BITS * s for s in AWQ_REVERSE_ORDER], dtype=torch.int32, device=device)


def pack(q: torch.Tensor) -> torch.Tensor:
    """Pack codes along dimension 1 in AWQ's order: [rows, out] integers in [0, 16) -> int32 [rows, out / 8].

    Raises:
        ValueError: ``out`` not a multiple of 8, or a code out of range.
    """
    if q.dim() != 2 or q.shape[1] % PACK:
        raise ValueError(f"cannot pack {tuple(q.shape)} codes along dim 1 by {PACK}")
    wide = q.to(torch.int64)
    if wide.numel():
        low, high = torch.aminmax(wide)
        if int(low) < 0 or int(high) >= 2 ** BITS:
            raise ValueError(f"codes must lie in [0, {2 ** BITS - 1}] for {BITS}-bit packing")
    codes = wide.view(q.shape[0], q.shape[1] // PACK, PACK)
    words = torch.zeros(codes.shape[:2], dtype=torch.int64, device=q.device)
    for j, nibble in enumerate(AWQ_REVERSE_ORDER):
        words |= codes[:, :, j] << (BITS * nibble)
    return torch.where(words >= 2 ** 31, words - 2 ** 32, words).to(torch.int32)


def unpack(words: torch.Tensor) -> torch.Tensor:
    """Inverse of ``pack``: int32 [rows, out / 8] -> int32 [rows, out] codes in [0, 16), in column order."""
    codes = (words.unsqueeze(2) >> _shifts(words.device)[None, None, :]) & (2 ** BITS - 1)
    return codes.reshape(words.shape[0], words.shape[1] * PACK)


def dequantize(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, *, group_size: int,
               dtype: torch.dtype = torch.float32, columns: tuple[int, int] | None = None) -> torch.Tensor:
    """The transposed weight ``W.T`` [in, out] (or columns ``[start, end)``, multiples of 8) in ``dtype``.

    Computed in float32, one group at a time (``(q - zero) * scale``, the integer difference exact, one rounding
    for the multiply), then cast to ``dtype`` once.
    """
    start, end = columns if columns is not None else (0, qweight.shape[1] * PACK)
    c0, c1 = start // PACK, -(-end // PACK)
    words = qweight[:, c0:c1]
    codes = words.unsqueeze(2) >> _shifts(words.device)[None, None, :]  # [K, cols / 8, 8] int32, fresh
    codes &= 2 ** BITS - 1  # in place: one temporary for the whole layer
    k = codes.shape[0]
    codes = codes.view(k, -1)[:, :end - start]
    zeros = unpack(qzeros[:, c0:c1])[:, :end - start]  # [G, cols]
    groups, cols = zeros.shape
    if codes.is_contiguous():
        codes = codes.view(groups, k // groups, cols)
        codes -= zeros[:, None, :]  # exact integer difference, in place
    else:
        codes = codes.reshape(groups, k // groups, cols) - zeros[:, None, :]
    # int32 times float32 is computed in float32: the cast and the multiply in one pass.
    w = torch.mul(codes, scales[:, start:end].to(torch.float32)[:, None, :])
    return w.view(k, cols).to(dtype)

def column_chunks(start: int, end: int, rows: int, *, budget_bytes: int = DEQUANT_CHUNK_BYTES
                  ) -> list[tuple[int, int]]:
    """Split output columns ``[start, end)`` into ranges whose float32 ``[rows, width]`` block fits
    ``budget_bytes`` (at least 8 columns each; every boundary but ``end`` a multiple of 8)."""
    width = max(PACK, (budget_bytes // max(1, rows * 4)) // PACK * PACK)
    return [(c, min(c + width, end)) for c in range(start, end, width)]
