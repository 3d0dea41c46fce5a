"""Linear layers: plain, merged (gate_up) and QKV, each loading HF's separate projections into one matrix, and
their tensor-parallel forms.

Merging q/k/v and gate/up into one matrix turns three (two) GEMMs into one per layer, the largest
easy win of a decode step. HF checkpoints store the projections separately, so the merged layers'
``weight_loader`` copies each one into its slice of the output dimension. The storage and the
product itself belong to the layer's ``LinearMethod`` (see ``linear_method``), which quantization
plugins replace.

Tensor parallelism is Megatron-LM's, as vLLM's ``ColumnParallelLinear``/``RowParallelLinear``: the merged layers
are column-parallel (each rank of the TP group holds ``1/tp`` of every projection's output features, whole
attention heads, KV heads replicated when ``tp`` exceeds them: ``distributed.sharding.attention_shard``), and
``RowParallelLinear`` (o_proj, down_proj) holds ``1/tp`` of the input features and sums the partial products with
an all-reduce. The loaders narrow each checkpoint tensor to the rank's slice before reading it. With one rank
(no world, or ``-tp 1``) every layer holds the whole matrix and runs exactly as without parallelism.
"""

from __future__ import annotations

import torch
from torch import nn

from brigade.distributed import get_tp_group
from brigade.distributed.sharding import attention_shard, divide
from brigade.model_executor.layers.linear_method import LinearMethod, UnquantizedLinearMethod
from brigade.model_executor.weight_utils import default_weight_loader, materialize, narrow_weight, set_weight_attrs


def bind_tp_group(layer: nn.Module) -> None:
    """Give ``layer`` this process's TP group, its size and the rank's place in it (``tp_group``, ``tp_size``,
    ``tp_rank``); callable before ``nn.Module.__init__`` (plain attributes only)."""
    tp = get_tp_group()
    object.__setattr__(layer, "tp_group", tp)
    object.__setattr__(layer, "tp_size", tp.world_size)
    object.__setattr__(layer, "tp_rank", tp.rank_in_group)


class LinearBase(nn.Module):
    """``y = x @ W.T + b`` with ``W`` stored however ``quant_method`` chooses.

    Invariant: ``output_sizes`` lists the out_features of each merged shard; the output is their
    concatenation, and shard ``i`` starts at ``sum(output_sizes[:i])``.
    """

    def __init__(self, input_size: int, output_sizes: list[int], *, bias: bool, dtype: torch.dtype,
                 quant_method: LinearMethod | None, shard_ids: list[str] | list[int] | None):
        super().__init__()
        self.input_size = input_size
        self.output_sizes = list(output_sizes)
        self.output_size = sum(output_sizes)
        self.shard_ids = shard_ids
        self.quant_method = quant_method or UnquantizedLinearMethod()
        # LoRA slots (brigade.lora.layers.LoRALinear), set by the LoRAManager when --enable-lora; with them,
        # every product adds the delta and the fused variants below step aside for the plain path.
        self.lora = None
        self.quant_method.create_weights(self, input_size=input_size, output_sizes=self.output_sizes,
                                         dtype=dtype)
        if bias:
            b = nn.Parameter(torch.empty(self.output_size, dtype=dtype), requires_grad=False)
            set_weight_attrs(b, {"output_dim": 0})
            self.register_parameter("bias", b)
        else:
            self.bias = None
        for param in self.parameters(recurse=False):
            attrs = {"weight_loader": self.weight_loader}
            if shard_ids is not None:
                attrs["shard_ids"] = tuple(shard_ids)
            set_weight_attrs(param, attrs)

    def weight_loader(self, param: torch.Tensor, loaded_weight: torch.Tensor,
                      shard_id: str | int | None = None) -> None:
        """Copy a whole checkpoint tensor into ``param`` (plain layers have no shards)."""
        if shard_id is not None:
            raise ValueError(f"{type(self).__name__} has no shards, got shard {shard_id!r}")
        default_weight_loader(param, loaded_weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Args: x [num_tokens, input_size]. Returns [num_tokens, output_size] in x's dtype (plus each token's
        LoRA delta when the layer has LoRA slots)."""
        out = self.quant_method.apply(self, x, self.bias)
        return out if self.lora is None else self.lora.apply(x, out)

    def forward_add(self, x: torch.Tensor, residual: torch.Tensor | None
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The product of a branch that ends in a skip connection: ``(out, rest)`` with ``out + rest`` the new
        residual stream (``rest`` None: ``out`` is the whole stream).

        Where the method has a kernel that adds the residual in the GEMM's epilogue for this batch, the add is
        done there and ``rest`` is None; otherwise the add is left to the next norm (``forward_normed``),
        whose fused add-and-normalize kernel does it in the same pass.

        Args: x [T, input_size]; residual [T, output_size] or None.
        """
        if residual is None:
            return self.forward(x), None
        if self.lora is not None:  # the epilogue kernel knows nothing of the delta: leave the add pending
            return self.forward(x), residual
        out = self.quant_method.apply_residual(self, x, self.bias, residual)
        return (out, None) if out is not None else (self.forward(x), residual)

    def forward_silu_mul(self, x: torch.Tensor, residual: torch.Tensor | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """``forward_add(silu(x[:, :in]) * x[:, in:], residual)`` with the activation inside the GEMM, or None
        when the layer's method has no such kernel for this input (the caller then runs the activation and
        ``forward_add``).

        Args: x [num_tokens, 2 * input_size], gate then up (a ``MergedColumnLinear`` gate_up output);
        residual as in ``forward_add``. Always None for a layer with LoRA slots (the delta needs the activation's
        output, which the fused kernel never writes).
        """
        if self.lora is not None:
            return None
        out = self.quant_method.apply_silu_mul(self, x, self.bias, residual=residual)
        if out is None and residual is not None:  # the kernel may take the activation but not the add
            out = self.quant_method.apply_silu_mul(self, x, self.bias)
            return None if out is None else (out, residual)
        return None if out is None else (out, None)

    def forward_normed(self, x: torch.Tensor, rest: torch.Tensor | None, norm: nn.Module
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """``forward(norm(x + rest))`` for an ``RMSNorm`` ``norm``; returns it and the stream ``x + rest``.

        With ``rest`` (an add left by ``forward_add``) the norm's fused add-and-normalize kernel makes both.
        Without it, when the norm's weight was folded into this layer (``fold_input_norm``) and the method has
        a kernel for it, one GEMM normalizes while it reads ``x``.

        Args: x, rest [num_tokens, input_size] (rest may be None). Returns ([num_tokens, output_size], stream).
        """
        if rest is not None:
            normed, stream = norm(x, rest)
            return self.forward(normed), stream
        if getattr(norm, "weight_folded", False) and self.lora is None:
            out = self.quant_method.apply_rms_norm(self, x, self.bias, norm.variance_epsilon)
            if out is not None:
                return out, x
        return self.forward(norm(x)), x

    def fold_input_norm(self, norm: nn.Module) -> bool:
        """Fold ``norm.weight`` (an ``RMSNorm`` applied to this layer's input) into the weight, leaving the
        norm's weight all ones and ``norm.weight_folded`` set; False when the method cannot (nothing changes).

        ``W @ (w * n)`` equals ``(W diag(w)) @ n``: the same function, rounded once more in the weight. A layer
        with LoRA slots refuses: its delta reads the normalized input with the norm's weight applied.
        """
        if self.lora is not None or not self.quant_method.fold_input_scale(self, norm.weight.data):
            return False
        norm.mark_weight_folded()
        return True

    def extra_repr(self) -> str:
        return (f"in={self.input_size}, out={self.output_sizes}, bias={self.bias is not None}, "
                f"method={type(self.quant_method).__name__}")


class Linear(LinearBase):
    """A single projection (o_proj, down_proj)."""

    def __init__(self, input_size: int, output_size: int, *, bias: bool = False, dtype: torch.dtype,
                 quant_method: LinearMethod | None = None):
        super().__init__(input_size, [output_size], bias=bias, dtype=dtype, quant_method=quant_method,
                         shard_ids=None)


class MergedColumnLinear(LinearBase):
    """Several projections of the same input stacked along the output dimension (gate_up_proj); column-parallel.

    Shard ids are the integer positions 0, 1, ... of ``output_sizes``. Under tensor parallelism ``output_sizes``
    are this rank's (``full_output_sizes[i] / tp`` each) and the weight loaders keep rank ``r``'s ``r``-th slice
    of each projection.
    """

    def __init__(self, input_size: int, output_sizes: list[int], *, bias: bool = False, dtype: torch.dtype,
                 quant_method: LinearMethod | None = None):
        bind_tp_group(self)
        local = [divide(size, self.tp_size, "output features") for size in output_sizes]
        super().__init__(input_size, local, bias=bias, dtype=dtype, quant_method=quant_method,
                         shard_ids=list(range(len(output_sizes))))
        self._set_full_shapes(output_sizes)

    def _set_full_shapes(self, full_output_sizes: list[int]) -> None:
        """Record the unsharded sizes, and each sharded parameter's whole shape (``full_shape``)."""
        self.full_output_sizes = list(full_output_sizes)
        if self.tp_size == 1:
            return
        for param in self.parameters(recurse=False):
            dim = getattr(param, "output_dim", None)
            if dim is not None:
                shape = list(param.shape)
                shape[dim] = sum(full_output_sizes) // getattr(param, "pack_factor", 1)
                set_weight_attrs(param, {"full_shape": tuple(shape)})

    def shard_rank(self, index: int) -> int:
        """Which of the ``tp`` equal slices of projection ``index`` this rank holds."""
        return self.tp_rank

    def shard_index(self, shard_id: str | int) -> int:
        """Position of ``shard_id`` in ``output_sizes``. Raises ValueError for an unknown id."""
        if self.shard_ids is None or shard_id not in self.shard_ids:
            raise ValueError(f"{type(self).__name__} has shards {self.shard_ids}, not {shard_id!r}")
        return self.shard_ids.index(shard_id)

    def weight_loader(self, param: torch.Tensor, loaded_weight: torch.Tensor,
                      shard_id: str | int | None = None) -> None:
        """Copy one projection's checkpoint tensor into its slice of the merged parameter.

        Raises:
            ValueError: ``shard_id`` is missing or unknown, or the tensor does not fit the slice.
        """
        if shard_id is None:
            # A checkpoint that already stores the merged matrix (e.g. re-saved by Brigade; dummy weights).
            if self.tp_size == 1:
                default_weight_loader(param, loaded_weight)
                return
            dim, start = getattr(param, "output_dim", 0), 0
            for sid, size in zip(self.shard_ids, self.full_output_sizes):
                self.weight_loader(param, narrow_weight(loaded_weight, dim, start, size), sid)
                start += size
            return
        index = self.shard_index(shard_id)
        output_dim = getattr(param, "output_dim", 0)
        if output_dim is None:
            # Per-shard scalars (a quantized method's per-tensor scales): stored [num_shards].
            default_weight_loader(param.data[index], loaded_weight)
            return
        pack_factor = getattr(param, "pack_factor", 1)
        # Each shard holds ceil(rows / pack_factor) stored rows: whole packs for packed weights; for block scales a
        # projection whose rows end inside a block keeps that partial block's own scale row.
        offset = sum(-(-size // pack_factor) for size in self.output_sizes[:index])
        size = -(-self.output_sizes[index] // pack_factor)
        target = param.data.narrow(output_dim, offset, size)
        if self.tp_size > 1:  # this rank's slice of the whole projection, read alone
            loaded_weight = narrow_weight(loaded_weight, output_dim, self.shard_rank(index) * size, size)
        loaded_weight = materialize(loaded_weight)
        if tuple(target.shape) != tuple(loaded_weight.shape):
            raise ValueError(f"shard {shard_id!r} of shape {tuple(loaded_weight.shape)} does not fit its "
                             f"slice of shape {tuple(target.shape)}")
        target.copy_(loaded_weight)


class QKVLinear(MergedColumnLinear):
    """Query, key and value projections in one matrix, shards ``"q"``, ``"k"``, ``"v"`` (GQA-aware).

    Output layout: ``[num_heads * head_size | num_kv_heads * head_size | num_kv_heads * head_size]``, where the
    head counts are this rank's under tensor parallelism (``shard``: whole query heads, and the KV heads they read,
    replicated over ``tp / total_num_kv_heads`` ranks when ``tp`` exceeds the KV heads).

    Raises:
        ValueError: ``tp`` does not divide the query heads, or the KV heads cannot be split or replicated evenly.
    """

    def __init__(self, hidden_size: int, head_size: int, num_heads: int, num_kv_heads: int, *,
                 bias: bool = False, dtype: torch.dtype, quant_method: LinearMethod | None = None):
        bind_tp_group(self)
        shard = attention_shard(num_heads, num_kv_heads, self.tp_rank, self.tp_size)
        sizes = [shard.num_heads * head_size, shard.num_kv_heads * head_size, shard.num_kv_heads * head_size]
        LinearBase.__init__(self, hidden_size, sizes, bias=bias, dtype=dtype, quant_method=quant_method,
                            shard_ids=["q", "k", "v"])
        self.shard = shard
        self._set_full_shapes([num_heads * head_size, num_kv_heads * head_size, num_kv_heads * head_size])
        self.head_size = head_size
        self.num_heads = shard.num_heads  # this rank's
        self.num_kv_heads = shard.num_kv_heads

    def shard_rank(self, index: int) -> int:
        """q: the rank's own slice; k and v: its KV heads' slice, shared by ``kv_replicas`` ranks."""
        if index == 0:
            return self.tp_rank
        return self.shard.kv_head_start // self.shard.num_kv_heads

    def split(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Split the merged output [T, q + 2 * kv] into q [T, H*D], k [T, Hkv*D], v [T, Hkv*D] (views)."""
        return qkv.split(self.output_sizes, dim=-1)


class RowParallelLinear(Linear):
    """A projection whose input features are split over the TP group (o_proj, down_proj): each rank multiplies
    its ``input_size / tp`` columns of ``W`` by its slice of the activations (the column-parallel layer before it
    left them split), and an all-reduce sums the partial products; the bias is added once, after the sum.

    Every parameter whose method marked an ``input_dim`` is split along it in ``tp`` equal parts, rank ``r``
    keeping part ``r``: the dense weight's columns, a GPTQ ``qweight``'s packed rows, the scale and zero rows of
    the rank's quantization groups, FP8 block-scale columns. Parameters without ``input_dim`` (per output channel
    or per tensor scales) are whole on every rank. A LoRA delta is added to the partial product before the
    all-reduce (its A holds the rank's input columns, B is whole), so the sum carries it once, as in vLLM's
    ``RowParallelLinearWithLoRA``.

    The epilogue fusions (residual add, SiLU-and-mul into the GEMM) keep what is exact under the sum: the
    activation still runs inside the GEMM, but the residual add waits for the reduced output (the next norm's
    fused add-and-normalize makes it). With one rank it is ``Linear`` itself.

    Attributes:
        full_input_size: the unsplit in_features; ``input_start``: the first of them this rank holds.
    """

    def __init__(self, input_size: int, output_size: int, *, bias: bool = False, dtype: torch.dtype,
                 quant_method: LinearMethod | None = None):
        bind_tp_group(self)
        local = divide(input_size, self.tp_size, "input features")
        # Plain attributes before Module.__init__: the method's create_weights reads them (``input_split``).
        self.full_input_size = input_size
        self.input_start = self.tp_rank * local
        super().__init__(local, output_size, bias=bias, dtype=dtype, quant_method=quant_method)
        if self.tp_size > 1:
            for param in self.parameters(recurse=False):
                dim = getattr(param, "input_dim", None)
                if dim is not None:
                    shape = list(param.shape)
                    shape[dim] *= self.tp_size
                    set_weight_attrs(param, {"full_shape": tuple(shape)})

    def weight_loader(self, param: torch.Tensor, loaded_weight: torch.Tensor,
                      shard_id: str | int | None = None) -> None:
        """Keep this rank's part of every parameter split along ``input_dim`` (the whole of the others)."""
        dim = getattr(param, "input_dim", None)
        if self.tp_size > 1 and dim is not None:
            size = param.shape[dim]
            loaded_weight = narrow_weight(loaded_weight, dim, self.tp_rank * size, size)
        super().weight_loader(param, loaded_weight, shard_id)

    def _reduce(self, partial: torch.Tensor) -> torch.Tensor:
        out = self.tp_group.all_reduce(partial)
        return out if self.bias is None else out + self.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Args: x [T, input_size / tp], this rank's features. Returns the summed [T, output_size]."""
        if self.tp_size == 1:
            return super().forward(x)
        partial = self.quant_method.apply(self, x, None)
        if self.lora is not None:
            partial = self.lora.apply(x, partial)
        return self._reduce(partial)

    def forward_partial(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's partial product, not reduced (``forward`` with one rank), for a caller that adds several
        partials and all-reduces once (the MoE block's shared expert). Args: x [T, input_size / tp]. Returns
        [T, output_size]. The bias, if any, is the caller's to add after the reduce."""
        if self.tp_size == 1:
            return super().forward(x)
        return self.quant_method.apply(self, x, None)

    def forward_add(self, x: torch.Tensor, residual: torch.Tensor | None
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.tp_size == 1:
            return super().forward_add(x, residual)
        return self.forward(x), residual

    def forward_silu_mul(self, x: torch.Tensor, residual: torch.Tensor | None = None
                         ) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        if self.tp_size == 1:
            return super().forward_silu_mul(x, residual)
        if self.lora is not None:
            return None
        out = self.quant_method.apply_silu_mul(self, x, None)
        return None if out is None else (self._reduce(out), residual)
