"""Stop conditions: when a request's output ends, checked after each appended token as vLLM v1 does."""

from __future__ import annotations

from brigade.core.request import Request, RequestStatus


def append_until_stop(request: Request, token_ids: list[int], max_model_len: int) -> list[int]:
    """Append a step's tokens one by one, applying the stop conditions after each, as if they had come one
    step at a time (a step with drafts returns up to k + 1 tokens).

    Returns:
        The tokens kept: those after a stop are dropped.
    """
    if len(token_ids) == 1:
        request.append_output_token_ids(token_ids)
        check_stop(request, max_model_len)
        return token_ids
    for i, token in enumerate(token_ids):
        request.append_output_token_ids([token])
        check_stop(request, max_model_len)
        if request.is_finished():
            return token_ids[:i + 1]
    return token_ids


def check_stop(request: Request, max_model_len: int) -> None:
    """Finish ``request`` if its last token ends it: EOS or a stop token id once ``min_tokens`` are out
    (FINISHED_STOPPED; a stop token other than EOS becomes its ``stop_reason``), else ``max_tokens`` or
    ``max_model_len`` reached (FINISHED_LENGTH_CAPPED). Stop strings are the front end's."""
    last = request.output_token_ids[-1]
    if request.num_output_tokens >= request.sampling_params.min_tokens and last in request.stop_token_ids:
        request.status = RequestStatus.FINISHED_STOPPED
        if last != request.eos_token_id:
            request.stop_reason = last
    elif request.num_output_tokens >= request.max_tokens or request.num_tokens >= max_model_len:
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
