"""Token embedding and LM head, which may share one matrix (tied embeddings, Press & Wolf 2017).

With ``tie_word_embeddings`` the checkpoint usually has no ``lm_head.weight``; ``LMHead.tie_to`` makes
the head use the embedding's parameter object itself, so one copy lives in memory and loading the
embedding fills both.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from brigade.model_executor.layers.linear_method import (dense_gemm_for_default_device, fold_scale_into_weight,
                                                         rms_norm_gemm_for_default_device)
from brigade.distributed import get_tp_group
from brigade.distributed.sharding import vocab_range
from brigade.model_executor.weight_utils import default_weight_loader, materialize, narrow_weight, set_weight_attrs


class _VocabShard:
    """This rank's rows of the (padded) vocabulary, and the loader that keeps them from a whole checkpoint tensor."""

    def __init__(self, vocab_size: int):
        self.tp = get_tp_group()
        self.vocab_size = vocab_size
        if self.tp.world_size == 1:
            self.start, self.end = 0, vocab_size
        else:
            self.start, self.end = vocab_range(vocab_size, self.tp.rank_in_group, self.tp.world_size)

    @property
    def num_rows(self) -> int:
        return self.end - self.start

    def make_param(self, tail: tuple[int, ...], dtype: torch.dtype) -> nn.Parameter:
        """A parameter of this rank's rows (zeroed: the padding rows stay zero) with its loader."""
        param = nn.Parameter(torch.zeros(self.num_rows, *tail, dtype=dtype), requires_grad=False)
        if self.tp.world_size == 1:
            set_weight_attrs(param, {"weight_loader": default_weight_loader})
        else:
            set_weight_attrs(param, {"weight_loader": self.load_rows, "full_shape": (self.vocab_size, *tail)})
        return param

    def load_rows(self, param: torch.Tensor, loaded_weight) -> None:
        """Copy rows ``[start, min(end, vocab_size))`` of a whole ``[vocab_size, ...]`` tensor; read only those.

        Raises:
            ValueError: the tensor is not ``[vocab_size, ...]`` of the parameter's trailing shape.
        """
        if tuple(loaded_weight.shape) != (self.vocab_size, *param.shape[1:]):
            raise ValueError(f"checkpoint tensor of shape {tuple(loaded_weight.shape)} does not fit a vocabulary "
                             f"of {self.vocab_size} rows of shape {tuple(param.shape[1:])}")
        rows = max(0, min(self.end, self.vocab_size) - self.start)
        if rows:
            part = materialize(narrow_weight(loaded_weight, 0, self.start, rows))
            param.data[:rows].copy_(part)


class VocabEmbedding(nn.Module):
    """Looks up the ``[vocab_size, hidden_size]`` embedding row of each token id."""

    def __init__(self, vocab_size: int, hidden_size: int, *, dtype: torch.dtype):
        super().__init__()
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.shard = _VocabShard(vocab_size)
        self.weight = self.shard.make_param((hidden_size,), dtype)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Args: input_ids [num_tokens] int64 in [0, vocab_size). Returns [num_tokens, hidden_size]."""
        shard = self.shard
        if shard.tp.world_size == 1:
            return F.embedding(input_ids, self.weight)
        held = (input_ids >= shard.start) & (input_ids < shard.end)  # [T] bool: rows this rank holds
        out = F.embedding((input_ids - shard.start) * held, self.weight)
        return shard.tp.all_reduce(out * held.unsqueeze(-1).to(out.dtype))

    def extra_repr(self) -> str:
        return f"{self.vocab_size}, {self.hidden_size}, rows [{self.shard.start}, {self.shard.end})"


class LMHead(nn.Module):
    """Projects hidden states onto the vocabulary: ``logits = h @ W.T (+ b)``."""

    def __init__(self, vocab_size: int, hidden_size: int, *, dtype: torch.dtype, bias: bool = False):
        super().__init__()
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.shard = _VocabShard(vocab_size)
        self.weight = self.shard.make_param((hidden_size,), dtype)
        if bias:
            self.bias = self.shard.make_param((), dtype)
        else:
            self.bias = None
        self.tied = False
        self.gemm = dense_gemm_for_default_device()
        self.rms_norm_gemm = rms_norm_gemm_for_default_device()

    def tie_to(self, embedding: VocabEmbedding) -> None:
        """Share ``embedding.weight`` (the same Parameter) instead of a weight of our own.

        Raises ValueError when the shapes differ.
        """
        if tuple(embedding.weight.shape) != tuple(self.weight.shape):
            raise ValueError(f"cannot tie an LM head of shape {tuple(self.weight.shape)} to an "
                             f"embedding of shape {tuple(embedding.weight.shape)}")
        self.weight = embedding.weight
        self.tied = True

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Args: hidden_states [N, hidden_size]. Returns logits [N, vocab_size] in the same dtype (every rank's
        rows gathered under tensor parallelism)."""
        return self._gather(self.gemm(hidden_states, self.weight, self.bias))

    def _gather(self, logits: torch.Tensor) -> torch.Tensor:
        """[N, rows of this rank] -> [N, vocab_size]: all-gather over the TP group, padding rows cut."""
        if self.shard.tp.world_size == 1:
            return logits
        return self.shard.tp.all_gather(logits, dim=-1)[:, :self.vocab_size]

    def forward_normed(self, hidden_states: torch.Tensor, norm: nn.Module) -> torch.Tensor:
        """``forward(norm(hidden_states))``, in one kernel when the final norm's weight was folded into the head
        (``fold_input_norm``) and the platform has a kernel for the shape. Args: [N, hidden_size]."""
        if norm.weight_folded and self.rms_norm_gemm is not None:
            out = self.rms_norm_gemm(hidden_states, self.weight, self.bias, norm.variance_epsilon)
            if out is not None:
                return self._gather(out)
        return self.forward(norm(hidden_states))

    def fold_input_norm(self, norm: nn.Module) -> bool:
        """Fold the final norm's weight into the head (see ``LinearBase.fold_input_norm``); False for a head tied
        to the embedding, whose matrix the embedding still reads."""
        if self.tied:
            return False
        fold_scale_into_weight(self.weight.data, norm.weight.data)
        norm.mark_weight_folded()
        return True

    def extra_repr(self) -> str:
        return f"{self.hidden_size} -> {self.vocab_size}, tied={self.tied}"
