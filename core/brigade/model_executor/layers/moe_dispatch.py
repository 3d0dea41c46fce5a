"""ExpertDispatch: tokens of every data-parallel rank to the experts of every rank, and their outputs back, when
experts spread over the DP x TP ranks (``--enable-expert-parallel`` with ``-dp`` above 1).

Each DP rank (engine) holds its own tokens; each rank of the expert-parallel group holds ``E / (dp * tp)`` whole
experts. One MoE layer then runs, on each rank (vLLM's naive "all-gather / reduce-scatter" all2all manager):

1. **dispatch**: all-gather over the DP group the rank's hidden states [T, H] and its routing (top-k weights and
   global expert ids, packed in one fp32 tensor [T, 2k]; ids are exact in fp32 below 2**24), each padded to the
   step's common size ``T_pad`` (the largest step of any DP rank; padding rows get weight 0), giving
   [dp * T_pad, ...] in DP-rank order;
2. the rank's own experts on every gathered token (``FusedMoE``: another rank's expert weighs 0);
3. **combine**: reduce-scatter over the DP group, so DP rank ``d`` gets rows ``[d * T_pad, (d + 1) * T_pad)`` of
   the sum over DP ranks, of which it keeps its first T. The TP ranks of a DP rank then all-reduce as under
   tensor parallelism (``SparseMoeBlock``), which completes the sum over the whole EP group.

Why all-gather + reduce-scatter and not an all-to-all: the all-to-all (DeepEP, pplx) sends each token only to
the ranks holding its top-k experts, which pays off at scale (many ranks, top-k much below the rank count) but
needs a count exchange, a sort by destination and variable-size buffers each layer. All-gather and reduce-scatter
are fixed-shape collectives that gloo (the CPU) and NCCL (CUDA, the device group) both run, need one host-side
size per step (``T_pad``), and keep every rank's shapes equal, which a captured CUDA graph needs; for a few DP
ranks with top-k near the rank count they move about as many bytes.

The step's ``T_pad`` is agreed once per forward pass (``dp_step``: an all-reduce MAX of each rank's token count
on the DP group's CPU group, vLLM's ``num_tokens_across_dp``), not once per layer. A replayed CUDA graph does not
run that host-side agreement: it keeps the size it was captured at, which every engine captured at the same time,
so the engines must replay graphs of the same size in the same step (``GraphDispatch.agree_across_dp``).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator

import torch

from brigade.distributed import GroupCoordinator

_STEP_TOKENS: contextvars.ContextVar[int | None] = contextvars.ContextVar("dp_step_tokens", default=None)


def agree_num_tokens(dp_group: GroupCoordinator, num_tokens: int) -> int:
    """The largest ``num_tokens`` of any rank of ``dp_group`` (an all-reduce MAX on its CPU group; every rank
    must call it, once per forward pass)."""
    return dp_group.max_over_group([num_tokens])[0]


@contextlib.contextmanager
def dp_step(num_tokens_padded: int) -> Iterator[None]:
    """Within the block, every MoE layer pads its tokens to ``num_tokens_padded`` rows before the dispatch (the
    step's size agreed over the DP ranks: ``agree_num_tokens``). Nests; restores the outer value on exit."""
    token = _STEP_TOKENS.set(num_tokens_padded)
    try:
        yield
    finally:
        _STEP_TOKENS.reset(token)


class ExpertDispatch:
    """Dispatch and combine of one MoE layer over the DP group (module docstring). Holds no tensors.

    Args:
        dp_group: the ranks holding the same TP shard in every DP engine (``get_dp_group``).
    """

    def __init__(self, dp_group: GroupCoordinator):
        self.group = dp_group

    def __call__(self, experts: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
                 x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        """This rank's experts' share of the MoE output for its own tokens, summed over the DP ranks.

        Args:
            experts: the rank's ``FusedMoE`` (global ids in, its experts' partial out).
            x: [T, H] this DP rank's hidden states, in the model dtype.
            topk_weights: [T, k] float32. topk_ids: [T, k] int, global expert ids.
        Returns:
            [T, H] in x's dtype: for each token, the contributions of the experts held by this TP shard's ranks
            of every DP engine (the caller's TP all-reduce adds the other shards').
        Raises:
            RuntimeError: ``dp_step`` set fewer rows than this rank's tokens (a caller's bug).
        """
        num_tokens = x.shape[0]
        padded = _STEP_TOKENS.get()
        if padded is None:  # a forward outside a step (tests): agree here, once per layer
            padded = agree_num_tokens(self.group, num_tokens)
        if padded < num_tokens:
            raise RuntimeError(f"the DP step was agreed at {padded} tokens but this rank runs {num_tokens}")
        routing = torch.cat([topk_weights.float(), topk_ids.float()], dim=1)  # [T, 2k]
        if padded > num_tokens:  # padding rows: zero hidden states, zero weights (expert 0, weighing nothing)
            x = torch.cat([x, x.new_zeros(padded - num_tokens, x.shape[1])])
            routing = torch.cat([routing, routing.new_zeros(padded - num_tokens, routing.shape[1])])
        all_x = self.group.all_gather(x, dim=0)  # [dp * T_pad, H]
        all_routing = self.group.all_gather(routing, dim=0)  # [dp * T_pad, 2k]
        top_k = topk_ids.shape[1]
        out = experts(all_x, all_routing[:, :top_k].contiguous(), all_routing[:, top_k:].to(topk_ids.dtype))
        return self.group.reduce_scatter(out)[:num_tokens]  # [T_pad, H] summed over DP, this rank's rows
