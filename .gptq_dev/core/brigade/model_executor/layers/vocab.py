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
from brigade.model_executor.weight_utils import default_weight_loader, set_weight_attrs


class VocabEmbedding(nn.Module):
    """Looks up the ``[vocab_size, hidden_size]`` embedding row of each token id."""

    def __init__(self, vocab_size: int, hidden_size: int, *, dtype: torch.dtype):
        super().__init__()
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size, dtype=dtype), requires_grad=False)
        set_weight_attrs(self.weight, {"weight_loader": default_weight_loader})

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Args: input_ids [num_tokens] int64 in [0, vocab_size). Returns [num_tokens, hidden_size]."""
        return F.embedding(input_ids, self.weight)

    def extra_repr(self) -> str:
        return f"{self.vocab_size}, {self.hidden_size}"


class LMHead(nn.Module):
    """Projects hidden states onto the vocabulary: ``logits = h @ W.T (+ b)``."""

    def __init__(self, vocab_size: int, hidden_size: int, *, dtype: torch.dtype, bias: bool = False):
        super().__init__()
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size, dtype=dtype), requires_grad=False)
        set_weight_attrs(self.weight, {"weight_loader": default_weight_loader})
        if bias:
            self.bias = nn.Parameter(torch.empty(vocab_size, dtype=dtype), requires_grad=False)
            set_weight_attrs(self.bias, {"weight_loader": default_weight_loader})
        else:
            self.bias = None
        self.tied = False
        self.gemm = dense_gemm_for_default_device()
        self.rms_norm_gemm = rms_norm_gemm_for_default_device()

    def tie_to(self, embedding: VocabEmbedding) -> None:
        """Share ``embedding.weight`` (the same Parameter) instead of a weight of our own.

        Raises ValueError when the shapes differ.
        """
        if tuple(embedding.weight.shape) != (self.vocab_size, self.hidden_size):
            raise ValueError(f"cannot tie an LM head of shape {(self.vocab_size, self.hidden_size)} to an "
                             f"embedding of shape {tuple(embedding.weight.shape)}")
        self.weight = embedding.weight
        self.tied = True

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Args: hidden_states [N, hidden_size]. Returns logits [N, vocab_size] in the same dtype."""
        return self.gemm(hidden_states, self.weight, self.bias)

    def forward_normed(self, hidden_states: torch.Tensor, norm: nn.Module) -> torch.Tensor:
        """``forward(norm(hidden_states))``, in one kernel when the final norm's weight was folded into the head
        (``fold_input_norm``) and the platform has a kernel for the shape. Args: [N, hidden_size]."""
        if norm.weight_folded and self.rms_norm_gemm is not None:
            out = self.rms_norm_gemm(hidden_states, self.weight, self.bias, norm.variance_epsilon)
            if out is not None:
                return out
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
