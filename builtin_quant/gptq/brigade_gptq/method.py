"""GPTQLinearMethod: a linear layer that keeps a GPTQ checkpoint's packed tensors and multiplies through them.

Parameters (names are the checkpoint's, relative to the layer, so HF names map onto them; ``pack = 32 // bits``,
``N = sum(output_sizes)``, ``K = input_size``, ``G = ceil(K / group_size)`` or 1; format in ``packing``):

* ``qweight`` int32 [K / pack, N], ``output_dim`` 1: a merged layer (qkv, gate_up) gets each projection's
  columns at its offset, the packing being along K.
* ``qzeros`` int32 [G, N / pack], ``output_dim`` 1, ``pack_factor`` pack: each projection's packed words land
  at ``offset / pack``, so every projection's width must be a multiple of ``pack``.
* ``scales`` float16 [G, N], ``output_dim`` 1.
* ``g_idx`` int32 [K] (a plain layer) or [num_shards, K] (a merged one: each projection brings its own;
  AutoGPTQ's act-order permutation comes from the input's Hessian, which q/k/v and gate/up share, so they are
  normally equal and collapse to one row after loading; when they differ each projection keeps its own and is
  multiplied separately). Optional in ``desc_act: false`` checkpoints, where it defaults to ``k // group_size``.

Compute, bound at construction from the default device like the core's dense GEMMs: on CUDA, a Triton GEMM
that dequantizes inside its K loop (``brigade_gptq.triton_gemm``; ``BRIGADE_GPTQ_TRITON=0`` turns it off);
elsewhere, and on CUDA without Triton, the portable PyTorch path: each forward dequantizes the layer to the
activation dtype, a column block of at most ``packing.DEQUANT_CHUNK_BYTES`` at a time, multiplies, and drops it.
Nothing dequantized outlives the call, so the weights stay at ``bits / 16`` of their fp16 size in memory. That
path dequantizes group by group (one zero and scale row broadcast over the group's rows, no per-element gather).

Act-order (``desc_act``) layers are re-stored row-sorted once at load (exllama's trick): ``perm`` is the stable
argsort of ``g_idx``, the packed rows of ``qweight`` are rewritten in that order and ``g_idx`` sorted, so each
group's rows are contiguous again, and every forward multiplies ``x[:, perm]`` by the sorted matrix (the same
sum, in another order). Both paths then take one zero/scale row per group instead of gathering one per row
(the Triton kernel's per-row gather made act-order layers several times slower;
``docs/performance-notes.md``).

Tensor parallelism (vLLM's GPTQ sharding): a column-parallel layer (qkv, gate_up) holds its output columns of
``qweight``, ``scales`` and the packed words of ``qzeros`` (each projection's slice must be whole words), with
the whole ``g_idx``; a row-parallel layer (o_proj, down_proj) holds its packed rows of ``qweight`` (``input_dim``
0), the scale and zero rows of its own groups and its part of ``g_idx``, rebased to its first group. That needs
``group_size`` to divide the rank's rows, and the rows of a group to be contiguous: an act-order checkpoint
(``desc_act``) is refused under ``-tp`` (its row-parallel layers' groups are spread over every rank's rows).
The fused variants of ``LinearMethod`` (norm, SiLU-and-mul, residual inside the GEMM) are not
offered; the model then runs those ops separately, and RMSNorm weights are not folded into GPTQ layers.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import nn

from brigade.model_executor.layers.linear_method import LinearMethod, input_split
from brigade.model_executor.weight_utils import set_weight_attrs
from brigade_gptq import envs

from brigade_gptq import packing
from brigade_gptq.config import SUPPORTED, GPTQConfig
from brigade_gptq.packing import column_chunks, unpack_cols, unpack_rows

logger = logging.getLogger(__name__)

TRITON_ENV = "BRIGADE_GPTQ_TRITON"


def kernel_for_device(device_type: str):
    """The fused GEMM for layers built on ``device_type`` (``triton_gemm.gptq_gemm`` on CUDA), or None for the
    PyTorch path. ``BRIGADE_GPTQ_TRITON=0`` forces the PyTorch path; a CUDA host without Triton gets it too,
    with a WARNING."""
    if device_type != "cuda" or not envs.BRIGADE_GPTQ_TRITON:
        return None
    try:
        from brigade_gptq.triton_gemm import gptq_gemm
    except ImportError as e:
        logger.warning("brigade-gptq: Triton is not importable (%s); GPTQ layers use the PyTorch dequantize-"
                       "then-matmul path on CUDA (pip install triton for the fused kernel)", e)
        return None
    return gptq_gemm


@dataclass
class Segment:
    """Output columns ``[start, end)`` of a layer that share one ``g_idx`` [K] int32 (the whole layer, or one
    projection of a merged layer whose projections differ).

    ``g_idx``: each stored row's group, in the stored (sorted) order. ``trivial``: ``g_idx`` is ``k // group_size``
    (every group complete and in place, which the kernel's one-row-per-block path needs). ``perm``: int64 [K], the
    checkpoint's row order of the stored rows (the stable argsort of the checkpoint's ``g_idx``): the input is
    ``x[:, perm]``; None when the checkpoint's rows were already in group order. ``group_rows``: ``(group, r0,
    r1)`` for each non-empty group, its stored rows ``r0:r1``.
    """

    start: int
    end: int
    g_idx: torch.Tensor
    trivial: bool
    perm: torch.Tensor | None
    group_rows: list[tuple[int, int, int]]


class GPTQLinearMethod(LinearMethod):
    """One linear layer of a GPTQ checkpoint; see the module docstring for its parameters and compute paths.

    After ``process_weights_after_loading``, ``segments`` lists the layer's ``Segment``s.
    """

    def __init__(self, config: GPTQConfig, prefix: str = ""):
        self.config = config
        self.prefix = prefix
        self.segments: list[Segment] = []
        self.gemm = None
        self.first_group = 0  # a row-parallel rank's first group: its g_idx is rebased by it after loading

    def _fail(self, what: str) -> ValueError:
        return ValueError(f"GPTQ layer {self.prefix or '?'}: {what}; {SUPPORTED}, with every layer's in_features "
                          f"and each projection's out_features divisible by {self.config.pack_factor} "
                          f"(32 / {self.config.bits} bits)")

    def _bad_checkpoint(self, what: str) -> ValueError:
        return ValueError(f"GPTQ layer {self.prefix or '?'}: {what}; the checkpoint is inconsistent")

    def num_groups(self, input_size: int) -> int:
        """Scale/zero groups of a layer with ``input_size`` rows: ``ceil(K / group_size)``, 1 for -1."""
        gs = self.config.group_size
        return 1 if gs == -1 else -(-input_size // gs)

    def default_g_idx(self, input_size: int, device: torch.device | None = None) -> torch.Tensor:
        """``k // group_size`` (all zeros for group_size -1): int32 [K]."""
        gs = self.config.group_size
        k = torch.arange(input_size, dtype=torch.int32, device=device)
        return torch.zeros_like(k) if gs == -1 else k // gs

    def create_weights(self, layer: nn.Module, *, input_size: int, output_sizes: list[int],
                       dtype: torch.dtype) -> None:
        """Register ``qweight``, ``qzeros``, ``scales`` and ``g_idx`` (see the module docstring).

        Raises:
            ValueError (one line): ``input_size`` or one of ``output_sizes`` is not a multiple of the pack
                factor, so the checkpoint's packed tensors cannot describe the layer.
        """
        pack = self.config.pack_factor
        if input_size % pack:
            raise self._fail(f"in_features {input_size} is not a multiple of {pack}, so its qweight rows "
                             "cannot be packed")
        bad = [size for size in output_sizes if size % pack]
        if bad:
            raise self._fail(f"out_features {bad[0]} (of {output_sizes}) is not a multiple of {pack}, so its qzeros "
                             "columns cannot be packed")
        grouped = self._check_row_split(layer, input_size)  # the group rows follow the input split
        out = sum(output_sizes)
        groups = self.num_groups(input_size)
        qweight = nn.Parameter(torch.zeros(input_size // pack, out, dtype=torch.int32), requires_grad=False)
        set_weight_attrs(qweight, {"output_dim": 1, "input_dim": 0})
        qzeros = nn.Parameter(torch.zeros(groups, out // pack, dtype=torch.int32), requires_grad=False)
        set_weight_attrs(qzeros, {"output_dim": 1, "pack_factor": pack, **grouped})
        scales = nn.Parameter(torch.zeros(groups, out, dtype=torch.float16), requires_grad=False)
        set_weight_attrs(scales, {"output_dim": 1, **grouped})
        g_idx = self.default_g_idx(input_size) + self.first_group  # the checkpoint's numbering: global groups
        if getattr(layer, "shard_ids", None) is not None:  # merged: one row per projection, loaded by index
            g_idx = g_idx.expand(len(output_sizes), input_size).clone()
        g_param = nn.Parameter(g_idx, requires_grad=False)
        set_weight_attrs(g_param, {"output_dim": None, "required_in_checkpoint": self.config.desc_act,
                                   "input_dim": g_idx.dim() - 1})
        for name, param in (("qweight", qweight), ("qzeros", qzeros), ("scales", scales), ("g_idx", g_param)):
            layer.register_parameter(name, param)
        self.gemm = kernel_for_device(torch.get_default_device().type)

    def _check_row_split(self, layer: nn.Module, input_size: int) -> dict:
        """For a row-parallel layer under ``-tp`` (``input_split``): refuse act-order and groups the split cuts,
        set ``first_group``, and return the attributes that split the group rows (``input_dim`` 0); ``{}`` for
        a layer that holds all its rows, or a single group (whole on every rank).

        Raises:
            ValueError (one line): ``desc_act`` checkpoint, or ``group_size`` not dividing the rank's rows.
        """
        start, full = input_split(layer, input_size)
        if full == input_size:
            return {}
        tp, gs = full // input_size, self.config.group_size
        if self.config.desc_act:
            raise ValueError(f"GPTQ layer {self.prefix or '?'}: an act-order checkpoint (desc_act true) cannot run "
                             f"with tensor parallelism (-tp {tp}): this row-parallel layer's groups are spread over "
                             "the rows of every rank; serve it with -tp 1, or quantize without desc_act")
        if gs == -1:
            return {}
        if input_size % gs:
            raise ValueError(f"GPTQ layer {self.prefix or '?'}: -tp {tp} splits its {full} input rows into "
                             f"{input_size} per rank, which group_size {gs} does not divide; use a -tp whose slice "
                             f"is a multiple of {gs}, or -tp 1")
        self.first_group = start // gs
        return {"input_dim": 0}

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Check ``g_idx`` against the groups, collapse a merged layer's equal rows, re-store act-order rows in
        group order (``qweight`` repacked, ``g_idx`` sorted; see the module docstring) and build ``segments``.

        Raises:
            ValueError (one line): a ``g_idx`` entry lies outside ``[0, groups)`` (the checkpoint's g_idx does
                not belong to its scales); the kernels would read out of bounds.
        """
        if self.segments:
            return
        g = layer.g_idx.data
        if self.first_group:
            g = g - self.first_group
        groups = layer.scales.shape[0]
        if g.numel() and (int(g.min()) < 0 or int(g.max()) >= groups):
            raise self._bad_checkpoint(f"g_idx holds groups {int(g.min())}..{int(g.max())}, outside the {groups} "
                                       "groups of its scales (a g_idx from another layer or group size)")
        g = g.to(torch.int32)
        if g.dim() == 2 and bool((g == g[:1]).all()):
            g = g[0].contiguous()
        if g.dim() == 1:
            bounds, rows = [0, layer.output_size], [g]
        else:
            bounds = [0]
            for size in layer.output_sizes:
                bounds.append(bounds[-1] + size)
            rows = list(g)
        self.segments = [self._sorted_segment(layer, bounds[i], bounds[i + 1], rows[i], groups)
                         for i in range(len(rows))]
        stored = torch.stack([seg.g_idx for seg in self.segments]) if g.dim() == 2 else self.segments[0].g_idx
        layer.g_idx = nn.Parameter(stored, requires_grad=False)

    def _sorted_segment(self, layer: nn.Module, start: int, end: int, g: torch.Tensor, groups: int) -> Segment:
        """The segment of columns ``[start, end)`` with checkpoint ``g_idx`` ``g``; rewrites those columns of
        ``qweight`` in group order when ``g`` is not sorted."""
        perm = None
        if g.shape[0] > 1 and bool((g[1:] < g[:-1]).any()):
            perm = torch.sort(g.long(), stable=True).indices
            g = g[perm].contiguous()
            bits, k = self.config.bits, g.shape[0]
            for c0, c1 in column_chunks(start, end, 2 * k, pack=self.config.pack_factor,
                                        budget_bytes=packing.DEQUANT_CHUNK_BYTES):  # int64 inside pack_rows
                codes = unpack_rows(layer.qweight.data[:, c0:c1], bits).index_select(0, perm)
                layer.qweight.data[:, c0:c1] = packing.pack_rows(codes, bits)
                del codes
        trivial = bool(torch.equal(g, self.default_g_idx(g.shape[0], device=g.device)))
        counts = torch.bincount(g.long(), minlength=groups).tolist()
        rows, r0 = [], 0
        for group, count in enumerate(counts):
            if count:
                rows.append((group, r0, r0 + count))
                r0 += count
        return Segment(start, end, g, trivial, perm, rows)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """Args: x [T, K] in the model dtype. Returns ``x @ W.T (+ bias)`` [T, N] in x's dtype."""
        if not self.segments:  # a forward before loading finished (dummy or partial checkpoints in tests)
            self.process_weights_after_loading(layer)
        if self.gemm is not None:
            return self._apply_kernel(layer, x, bias)
        return self._apply_torch(layer, x, bias)

    def _apply_kernel(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        cfg = self.config
        gs = cfg.group_size if cfg.group_size != -1 else layer.input_size
        if len(self.segments) == 1:
            seg = self.segments[0]
            xs = x if seg.perm is None else x.index_select(1, seg.perm)
            return self.gemm(xs, layer.qweight, layer.qzeros, layer.scales, seg.g_idx, bits=cfg.bits,
                             zero_offset=cfg.zero_offset, group_size=gs, trivial_g_idx=seg.trivial, bias=bias)
        out = torch.empty(x.shape[0], layer.output_size, dtype=x.dtype, device=x.device)
        pack = cfg.pack_factor
        for seg in self.segments:
            a, b = seg.start, seg.end
            xs = x if seg.perm is None else x.index_select(1, seg.perm)
            self.gemm(xs, layer.qweight[:, a:b], layer.qzeros[:, a // pack:b // pack], layer.scales[:, a:b],
                      seg.g_idx, bits=cfg.bits, zero_offset=cfg.zero_offset, group_size=gs,
                      trivial_g_idx=seg.trivial, bias=None if bias is None else bias[a:b], out=out[:, a:b])
        return out

    def dequantize_block(self, layer: nn.Module, seg: Segment, c0: int, c1: int, dtype: torch.dtype
                         ) -> torch.Tensor:
        """Columns ``[c0, c1)`` (inside ``seg``; ``c0`` a multiple of pack) of the stored ``W.T`` (rows in group
        order): [K, c1 - c0] in ``dtype``, computed in float32 as ``(q - zero) * scale`` one group at a time (bit
        for bit ``packing.dequantize`` of the stored tensors)."""
        cfg = self.config
        pack = cfg.pack_factor
        codes = unpack_rows(layer.qweight[:, c0:c1], cfg.bits)  # [K, cols] int32
        zeros = unpack_cols(layer.qzeros[:, c0 // pack:-(-c1 // pack)], cfg.bits)[:, :c1 - c0] + cfg.zero_offset
        scales = layer.scales[:, c0:c1].to(torch.float32)
        w = torch.empty(codes.shape, dtype=torch.float32, device=codes.device)
        for group, r0, r1 in seg.group_rows:
            rows = codes[r0:r1]
            torch.sub(rows, zeros[group], out=rows)
            torch.mul(rows, scales[group], out=w[r0:r1])
        return w.to(dtype)

    def _apply_torch(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        cfg = self.config
        out = None
        single = len(self.segments) == 1
        for seg in self.segments:
            xs = x if seg.perm is None else x.index_select(1, seg.perm)
            chunks = column_chunks(seg.start, seg.end, layer.input_size, pack=cfg.pack_factor,
                                   budget_bytes=packing.DEQUANT_CHUNK_BYTES)
            single = single and len(chunks) == 1
            if out is None and not single:
                out = x.new_empty(x.shape[0], layer.output_size)
            for c0, c1 in chunks:
                w = self.dequantize_block(layer, seg, c0, c1, x.dtype)  # [K, c1 - c0]
                if single:
                    out = xs @ w
                else:
                    out[:, c0:c1] = xs @ w
                del w
        if bias is not None:
            out = out + bias
        return out
