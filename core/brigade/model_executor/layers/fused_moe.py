"""FusedMoE: the experts of a mixture-of-experts layer, stacked per layer, and their product as one op.

Checkpoints store one tensor per expert and per projection (``experts.{e}.gate_proj/up_proj/down_proj`` in Qwen
MoE, ``experts.{e}.w1/w3/w2`` in Mixtral). The layer stacks them at load into two parameters, as vLLM's
``FusedMoE`` does:

* ``w13_weight`` [num_experts, 2 * intermediate, hidden]: expert ``e``'s gate projection (``"w1"``) in rows
  ``[0, I)`` and its up projection (``"w3"``) in rows ``[I, 2I)``;
* ``w2_weight`` [num_experts, hidden, intermediate]: its down projection (``"w2"``).

With ``bias`` (gpt-oss) two more, loaded by the same shard ids: ``w13_bias`` [num_experts, 2 * intermediate] (gate
then up) and ``w2_bias`` [num_experts, hidden].

The product is ``sum_j w_j * down_e(act(gate_e(x)) * up_e(x))`` over each token's ``top_k`` experts ``e = ids[j]``
with the router's weights ``w_j`` (``moe_router.select_experts``); ``act`` is SiLU or gpt-oss's clamped SwiGLU
(``moe_activation``), and with biases ``gate_e``, ``up_e`` and ``down_e`` are affine (the router weight scales the
down bias too, as transformers' ``GptOssExperts`` does). It is a ``CustomOp`` (op ``"fused_moe"``):
``forward_native`` below is the CPU path and the reference the fast kernels are checked against; brigade-cuda
registers its Triton kernel (tokens sorted and padded by expert, one grouped GEMM for gate/up with SiLU-and-mul,
one for down with the router weights, then the sum over the top-k) through the ``register_kernels`` hook.

Parallelism (docs/moe.md). The layer computes this rank's *partial* output; its caller (``SparseMoeBlock``) adds
the shared expert's partial and all-reduces once per layer.

* Tensor parallelism (``-tp N``): each rank holds every expert's slice ``[rank * I/tp, (rank + 1) * I/tp)`` of the
  intermediate dimension: rows of gate and of up (each cut on its own, so ``w13`` stays "gate rows, then up
  rows"), columns of down. ``silu(gate) * up`` is elementwise over the intermediate dimension, so each rank's
  down product is a partial sum of the whole one (Megatron-LM's column- then row-parallel MLP, per expert).
  Gate and up biases are sliced with their rows; the down bias is whole on rank 0 and zero on the others, so the
  all-reduce adds it once.
* Expert parallelism (``--enable-expert-parallel``): each rank of the EP group holds ``E / ep`` whole experts,
  ``[rank * E/ep, (rank + 1) * E/ep)``. Inside one engine every rank of the group already has every token (the
  EP group is the TP group), so there is no dispatch to do: each rank computes its own experts' contributions
  for all tokens, zero for tokens routed elsewhere (``local_routing`` gives them weight 0), and the partial sums
  are all-reduced, as under TP. vLLM's all-to-all dispatch (DeepEP, pplx) pays off when ranks hold different
  tokens (DP x EP across engines), which Brigade does not run; here an all-to-all would only move tokens every
  rank already has. The kernel's contract does not change: it sees fewer experts (local ids).

Each rank reads only its part of a checkpoint tensor (``shard_intermediate`` narrows a lazy ``CheckpointTensor``;
another rank's expert is not read at all).

Quantization (``--quantization fp8``): a ``MoEMethod`` (``linear_method``) turns the loaded weights into FP8 with
one fp32 scale per expert and output channel, ``w13_weight_scale`` [E_local, 2 * I_local] (sliced with w13's rows
under TP) and ``w2_weight_scale`` [E_local, H] (down's output channels are not split under TP, so every rank holds
the whole row's scale); the products dequantize each expert's weights as they use them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from brigade.model_executor.layers.custom_op import CustomOp
from brigade.model_executor.layers.linear_method import MoEMethod
from brigade.model_executor.layers.moe_activation import SILU, MoEActivation, moe_act_and_mul
from brigade.model_executor.weight_utils import materialize, narrow_weight, set_weight_attrs

GATE, UP, DOWN = "w1", "w3", "w2"
"""Projection shard ids (vLLM's and Mixtral's names): gate and up go into ``w13_weight``, down into ``w2_weight``."""


class FusedMoE(CustomOp):
    """A layer's experts on this rank: ``w13_weight`` [E_local, 2 * I_local, H] and ``w2_weight``
    [E_local, H, I_local] in the model dtype.

    Invariants: under tensor parallelism ``E_local = num_experts`` and ``I_local = intermediate_size // tp_size``,
    slice ``tp_rank`` of every expert's intermediate dimension; under expert parallelism ``E_local = num_experts
    // ep_size``, experts ``[expert_start, expert_start + E_local)`` whole (``I_local = intermediate_size``).
    With one rank both are the whole layer.

    With a ``quant_method`` (``MoEMethod``), after loading: both weights ``float8_e4m3fn``, ``w13_weight_scale``
    [E_local, 2 * I_local] and ``w2_weight_scale`` [E_local, H] fp32; without one both scales are None.
    With ``bias``: ``w13_bias`` [E_local, 2 * I_local] (sliced like w13's rows) and ``w2_bias`` [E_local, H] (zero
    on TP ranks other than 0) in the model dtype; without, both None.

    A kernel registered for ``"fused_moe"`` is called ``impl(layer, x, topk_weights, topk_ids)`` with
    ``forward_native``'s contract (ids local, in ``[0, E_local)``) and reads ``layer.w13_weight``,
    ``layer.w2_weight``, their scales (None, or the FP8 layout above), ``layer.w13_bias``, ``layer.w2_bias`` and
    ``layer.activation`` (``MoEActivation``).

    Raises:
        ValueError: ``tp_size`` does not divide ``intermediate_size`` or ``ep_size`` does not divide
            ``num_experts``.
    """

    op_name = "fused_moe"

    def __init__(self, num_experts: int, top_k: int, hidden_size: int, intermediate_size: int, *,
                 dtype: torch.dtype, tp_rank: int = 0, tp_size: int = 1, ep_rank: int = 0, ep_size: int = 1,
                 quant_method: MoEMethod | None = None, activation: MoEActivation = SILU, bias: bool = False):
        super().__init__()
        if intermediate_size % tp_size:
            raise ValueError(f"the experts' intermediate size {intermediate_size} does not divide over {tp_size} "
                             "tensor-parallel ranks")
        if num_experts % ep_size:
            raise ValueError(f"{num_experts} experts do not divide over {ep_size} expert-parallel ranks")
        self.num_experts = num_experts
        self.top_k = top_k
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.activation = activation
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.ep_rank, self.ep_size = ep_rank, ep_size
        self.num_local_experts = num_experts // ep_size
        self.expert_start = ep_rank * self.num_local_experts  # global id of local expert 0
        self.intermediate_size_per_partition = local = intermediate_size // tp_size
        self.w13_weight = nn.Parameter(torch.empty(self.num_local_experts, 2 * local, hidden_size, dtype=dtype),
                                       requires_grad=False)
        self.w2_weight = nn.Parameter(torch.empty(self.num_local_experts, hidden_size, local, dtype=dtype),
                                      requires_grad=False)
        experts = range(self.expert_start, self.expert_start + self.num_local_experts)  # global ids
        set_weight_attrs(self.w13_weight, {"weight_loader": self.weight_loader,
                                           "shard_ids": tuple((e, p) for e in experts for p in (GATE, UP))})
        set_weight_attrs(self.w2_weight, {"weight_loader": self.weight_loader,
                                          "shard_ids": tuple((e, DOWN) for e in experts)})
        self.w13_bias = self.w2_bias = None
        if bias:
            self.w13_bias = nn.Parameter(torch.empty(self.num_local_experts, 2 * local, dtype=dtype),
                                         requires_grad=False)
            self.w2_bias = nn.Parameter(torch.empty(self.num_local_experts, hidden_size, dtype=dtype),
                                        requires_grad=False)
            set_weight_attrs(self.w13_bias, {"weight_loader": self.weight_loader,
                                             "shard_ids": tuple((e, p) for e in experts for p in (GATE, UP))})
            set_weight_attrs(self.w2_bias, {"weight_loader": self.weight_loader,
                                            "shard_ids": tuple((e, DOWN) for e in experts)})
        self.w13_weight_scale: torch.Tensor | None = None  # set by a quant_method after loading
        self.w2_weight_scale: torch.Tensor | None = None
        if quant_method is not None:  # the loader calls its process_weights_after_loading
            self.quant_method = quant_method
        if tp_size > 1 or ep_size > 1:  # the whole layer's shapes, for dummy weights drawn layout-independently
            set_weight_attrs(self.w13_weight, {"full_shape": (num_experts, 2 * intermediate_size, hidden_size)})
            set_weight_attrs(self.w2_weight, {"full_shape": (num_experts, hidden_size, intermediate_size)})
            if bias:
                set_weight_attrs(self.w13_bias, {"full_shape": (num_experts, 2 * intermediate_size)})
                set_weight_attrs(self.w2_bias, {"full_shape": (num_experts, hidden_size)})

    def shard_intermediate(self, loaded_weight: torch.Tensor, dim: int) -> torch.Tensor:
        """This rank's slice of a checkpoint tensor (or lazy ``CheckpointTensor``) along its intermediate
        dimension ``dim`` (the tensor itself at ``tp_size`` 1), read from the file."""
        if self.tp_size > 1:
            local = self.intermediate_size_per_partition
            loaded_weight = narrow_weight(loaded_weight, dim, self.tp_rank * local, local)
        return materialize(loaded_weight)

    def local_routing(self, topk_weights: torch.Tensor, topk_ids: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """The routing as this rank's experts see it: global ids to local ones, and the weight of every
        assignment to another rank's expert set to 0 (its id to local 0), so that the rank's output is its
        experts' share of the sum. Args and returns: [T, top_k] float32 weights and int ids."""
        local_ids = topk_ids - self.expert_start
        here = (local_ids >= 0) & (local_ids < self.num_local_experts)
        return topk_weights * here, torch.where(here, local_ids, torch.zeros_like(local_ids))

    def weight_loader(self, param: torch.Tensor, loaded_weight: torch.Tensor,
                      shard_id: tuple[int, str] | None = None) -> None:
        """Copy one expert's projection into its place in the stacked parameter.

        Args:
            param: ``w13_weight``, ``w2_weight``, ``w13_bias`` or ``w2_bias``.
            loaded_weight: the checkpoint tensor: gate or up [I, H], down [H, I]; biases: gate or up [I], down [H].
            shard_id: ``(expert_id, "w1" | "w3" | "w2")``; or None with the whole layer's stacked tensor of
                ``full_shape`` (dummy weights under TP or EP), of which the rank keeps its part.

        Raises:
            ValueError: no or an unknown shard id, an expert id out of range, a projection that does not belong
                to ``param``, or a tensor that does not fit its slice.
        """
        if shard_id is None and tuple(loaded_weight.shape) == getattr(param, "full_shape", None):
            self._load_stacked(param, loaded_weight)
            return
        if not isinstance(shard_id, tuple) or len(shard_id) != 2:
            raise ValueError(f"{type(self).__name__} loads one expert's projection at a time: the shard id is "
                             f"(expert_id, 'w1' | 'w3' | 'w2'), got {shard_id!r}")
        expert_id, proj = shard_id
        if not 0 <= expert_id < self.num_experts:
            raise ValueError(f"expert {expert_id} is out of range: the layer has {self.num_experts} experts")
        gate_up = any(param is p for p in (self.w13_weight, self.w13_bias) if p is not None)
        down = any(param is p for p in (self.w2_weight, self.w2_bias) if p is not None)
        if proj not in ((GATE, UP) if gate_up else (DOWN,) if down else ()):
            raise ValueError(f"projection {proj!r} does not belong to this parameter of {type(self).__name__}")
        index = expert_id - self.expert_start
        if not 0 <= index < self.num_local_experts:
            return  # another expert-parallel rank's expert: not read
        local = self.intermediate_size_per_partition
        if param is self.w2_bias:  # [H], added once over the TP ranks: rank 0's, zero elsewhere
            target, source = param.data[index], materialize(loaded_weight)
            if self.tp_rank > 0:
                source = torch.zeros_like(target)
        elif proj == DOWN:
            target = param.data[index]  # [H, I_local]
            source = self.shard_intermediate(loaded_weight, 1)
        else:
            target = param.data[index].narrow(0, 0 if proj == GATE else local, local)  # [I_local, H] or [I_local]
            source = self.shard_intermediate(loaded_weight, 0)
        if tuple(source.shape) != tuple(target.shape):
            raise ValueError(f"expert {expert_id}'s {proj} of shape {tuple(loaded_weight.shape)} does not fit its "
                             f"slice of shape {tuple(target.shape)}")
        target.copy_(source)

    def _load_stacked(self, param: torch.Tensor, stacked: torch.Tensor) -> None:
        """Keep this rank's part of the whole layer's stacked tensor (``full_shape``: ``--load-format dummy``
        draws it so, the same whatever the layout), one local expert and projection at a time."""
        inter = self.intermediate_size
        for expert in range(self.expert_start, self.expert_start + self.num_local_experts):
            if param is self.w13_weight or param is self.w13_bias:
                self.weight_loader(param, stacked[expert, :inter], (expert, GATE))
                self.weight_loader(param, stacked[expert, inter:], (expert, UP))
            else:
                self.weight_loader(param, stacked[expert], (expert, DOWN))

    def forward(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        """This rank's share of the experts' output: the whole of it with one rank; under TP or EP a partial sum
        the caller all-reduces. Args: x [T, hidden]; topk_weights [T, top_k] float32; topk_ids [T, top_k] int,
        global expert ids. Returns [T, hidden] in x's dtype."""
        if self.ep_size > 1:
            topk_weights, topk_ids = self.local_routing(topk_weights, topk_ids)
        return super().forward(x, topk_weights, topk_ids)

    def forward_native(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        """Args: x [T, hidden] in the model dtype; topk_weights [T, top_k] float32; topk_ids [T, top_k] int, local
        expert ids. Returns [T, hidden] in x's dtype (``fused_moe_reference``, dequantizing FP8 experts one at a
        time)."""
        return fused_moe_reference(x, self.w13_weight, self.w2_weight, topk_weights, topk_ids,
                                   w13_scale=self.w13_weight_scale, w2_scale=self.w2_weight_scale,
                                   w13_bias=self.w13_bias, w2_bias=self.w2_bias, activation=self.activation)

    def extra_repr(self) -> str:
        return (f"experts={self.num_local_experts}/{self.num_experts}, top_k={self.top_k}, hidden={self.hidden_size}, "
                f"intermediate={self.intermediate_size_per_partition}, weights={self.w13_weight.dtype}, "
                f"activation={self.activation.name}, bias={self.w13_bias is not None}, impl={self.impl_name}")


def expert_weight(w: torch.Tensor, scale: torch.Tensor | None, expert: int, dtype: torch.dtype) -> torch.Tensor:
    """Expert ``expert``'s [N, K] weight in ``dtype``: ``w[expert]`` itself, or with a per-channel ``scale``
    ([E, N] fp32) the FP8 codes times their scale, computed in fp32 and rounded once to ``dtype``."""
    if scale is None:
        return w[expert]
    return (w[expert].float() * scale[expert].float()[:, None]).to(dtype)


def fused_moe_reference(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                        topk_ids: torch.Tensor, *, w13_scale: torch.Tensor | None = None,
                        w2_scale: torch.Tensor | None = None, w13_bias: torch.Tensor | None = None,
                        w2_bias: torch.Tensor | None = None, activation: MoEActivation = SILU) -> torch.Tensor:
    """The mixture of experts in plain PyTorch: for each expert in turn, the tokens routed to it, their gated
    product and its router weight, added into an fp32 sum (transformers' ``MixtralExperts.forward`` order).

    Args:
        x: [T, H] hidden states in the model dtype.
        w13: [E, 2I, H] gate rows then up rows of each expert. w2: [E, H, I]. In x's dtype, or
            ``float8_e4m3fn`` with ``w13_scale`` [E, 2I] and ``w2_scale`` [E, H] fp32 (one per expert and output
            channel): each expert's weights are then dequantized when its tokens are computed (``expert_weight``),
            so the result is the unquantized path's on the dequantized weights, holding one expert's at a time.
        topk_weights: [T, k] float32. topk_ids: [T, k] int32 or int64, each in [0, E).
        w13_bias: [E, 2I] (gate then up), w2_bias: [E, H], in x's dtype, or None: added to each product's output
            (the down bias before the router weight, as transformers' ``GptOssExperts``).
        activation: ``act`` in ``act(gate) * up`` (``moe_activation``).

    Returns:
        [T, H] in x's dtype. Each expert's product is computed in x's dtype, as transformers does; the weighted
        sum over the top-k in fp32, rounded once. Synchronizes with the device (a per-expert count); the fast
        kernels replace it on accelerators.
    """
    num_tokens, top_k = topk_ids.shape
    num_experts, inter = w2.shape[0], w2.shape[2]
    flat_ids = topk_ids.reshape(-1).long()  # [T*k]: assignment a = token * k + slot
    order = torch.argsort(flat_ids, stable=True)  # assignments grouped by expert
    counts = torch.bincount(flat_ids, minlength=num_experts).tolist()
    flat_weights = topk_weights.reshape(-1)
    # Each assignment's weighted output, then the sum per token. (Not index_add_ into the output: its CPU kernel
    # is orders of magnitude slower than a plain indexed store; docs/performance-notes.md.)
    per_assignment = torch.empty(num_tokens * top_k, x.shape[1], dtype=torch.float32, device=x.device)
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        assignments = order[start:start + count]
        start += count
        gate_up = F.linear(x[assignments // top_k], expert_weight(w13, w13_scale, expert, x.dtype),
                           None if w13_bias is None else w13_bias[expert])  # [n, 2I]
        act = moe_act_and_mul(gate_up[:, :inter], gate_up[:, inter:], activation)
        down = F.linear(act, expert_weight(w2, w2_scale, expert, x.dtype),
                        None if w2_bias is None else w2_bias[expert])
        per_assignment[assignments] = down.float() * flat_weights[assignments, None]
    # Add each token's experts in increasing expert id, the order transformers adds them in.
    by_expert = per_assignment.view(num_tokens, top_k, -1)[
        torch.arange(num_tokens, device=x.device)[:, None], topk_ids.argsort(dim=1)]  # [T, k, H]
    out = torch.zeros(num_tokens, x.shape[1], dtype=torch.float32, device=x.device)
    for slot in range(top_k):
        out += by_expert[:, slot]
    return out.to(x.dtype)
