"""Prompt logprobs: the logprobs of the prompt tokens a step's chunks predict.

The hidden state at position p scores prompt token p + 1; a chunk covering positions [c, c + n) yields rows
for tokens c + 1 .. min(c + n, num_prompt_tokens - 1). Column 0 is the prompt token (its rank from the raw
logits, like sampled logprobs), then the top ``prompt_logprobs``. Logits are made ``ROWS_PER_BLOCK`` at a
time so a long prompt never holds [T, vocab] at once.
"""

from __future__ import annotations

import torch

from brigade.interfaces import LogprobsLists
from brigade.worker.input_batch import CachedRequestState, StepInputs
from brigade.worker.request_states import StepBatch

ROWS_PER_BLOCK = 256  # prompt positions scored per logits block ([rows, vocab] f32 at a time)


def prompt_logprobs(model: torch.nn.Module, batch: StepBatch, inputs: StepInputs,
                    hidden: torch.Tensor) -> dict[str, LogprobsLists]:
    """Per request of ``batch`` with prompt_logprobs, the rows its chunk scores, from ``hidden`` ([num_tokens,
    hidden], the step's token rows) and ``model.compute_logits``. Called before num_computed_tokens moves past
    the chunk."""
    starts = inputs.metadata.query_start_loc_cpu.tolist()
    out: dict[str, LogprobsLists] = {}
    for i, (rid, state) in enumerate(zip(batch.req_ids, batch.states)):
        k = state.sampling.params.prompt_logprobs
        first = state.num_computed_tokens
        last = min(first + starts[i + 1] - starts[i], state.num_prompt_tokens - 1)
        if k is None or last <= first:
            continue
        out[rid] = _score_chunk(model, state, hidden[starts[i]:starts[i + 1]], first, last, k)
    return out


def _score_chunk(model: torch.nn.Module, state: CachedRequestState, hidden: torch.Tensor, first: int, last: int,
                 k: int) -> LogprobsLists:
    """Score prompt tokens first + 1 .. last of one request from its chunk's hidden states (row 0: position
    ``first``), with the top ``k``."""
    ids, lps, ranks = [], [], []
    for lo in range(first, last, ROWS_PER_BLOCK):
        hi = min(lo + ROWS_PER_BLOCK, last)
        logprobs = torch.log_softmax(model.compute_logits(hidden[lo - first:hi - first]).float(), dim=-1)  # [R, V]
        targets = torch.tensor(state.token_ids[lo + 1:hi + 1], device=logprobs.device)[:, None]
        chosen = logprobs.gather(1, targets)  # [R, 1]
        top = logprobs.topk(k, dim=-1) if k else None
        ids += torch.cat([targets, top.indices], 1).tolist() if top else targets.tolist()
        lps += torch.cat([chosen, top.values], 1).tolist() if top else chosen.tolist()
        ranks += ((logprobs > chosen).sum(-1) + 1).tolist()
    return LogprobsLists(token_ids=ids, logprobs=lps, ranks=ranks)
