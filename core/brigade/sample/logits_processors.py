"""Logits processors: per-batch transforms of the logits, built from the rows' SamplingParams.

Each processor class says whether it is argmax-invariant. Those that are not (logit_bias, min_tokens,
allowed tokens, bad words) can change the greedy pick, so the Sampler runs them before the greedy
shortcut; argmax-invariant ones (min_p) only reshape the distribution and run after temperature.
A class is instantiated for a step only when ``needs(params)`` is true for at least one row.
Built-ins are exported as ``BUILTIN_LOGITS_PROCESSORS`` and registered through the plugin hook
``register_logits_processors`` like any plugin's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, ClassVar

import torch

from brigade.sample.transfer import to_device
from brigade.sampling_params import InvalidParamError, SamplingParams

if TYPE_CHECKING:
    from brigade.sample.metadata import SamplingMetadata

__all__ = [
    "LogitsProcessor", "AllowedTokenIdsLogitsProcessor", "BadWordsLogitsProcessor",
    "LogitBiasLogitsProcessor", "MinTokensLogitsProcessor", "MinPLogitsProcessor",
    "BUILTIN_LOGITS_PROCESSORS", "validate_logits_processor_params",
]

_NEG_INF = float("-inf")


def mask_positions(logits: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> None:
    """``logits[rows, cols] = -inf`` in place, without a host-device synchronization.

    ``logits[rows, cols] = float("-inf")`` would copy the Python scalar from pageable host memory, a copy that waits
    for the stream; under overlapped scheduling that stalls the host behind the step in flight. The fill value is
    made on the logits' device instead.
    """
    logits.index_put_((rows, cols), torch.full((), _NEG_INF, dtype=logits.dtype, device=logits.device))
# OpenAI accepts logit_bias values in [-100, 100].
_MAX_ABS_LOGIT_BIAS = 100.0


class LogitsProcessor:
    """A transform of the batch's logits for one step.

    Invariant: ``apply`` changes only rows whose params ``needs``; the others are left untouched.

    Subclasses set the class attributes, build their (tensor) state in ``__init__`` from the step's
    SamplingMetadata, and implement ``needs`` and ``apply``. ``validate`` is called by the front end
    when a request arrives, so a bad parameter fails with a 400 and never reaches the engine.
    """

    name: ClassVar[str] = ""
    # True when the processor cannot change which token has the largest logit.
    is_argmax_invariant: ClassVar[bool] = False
    # True when the processor only forbids tokens; the Sampler applies these with the grammar bitmask.
    is_mask: ClassVar[bool] = False

    def __init__(self, metadata: SamplingMetadata) -> None:
        self.metadata = metadata

    @classmethod
    def needs(cls, params: SamplingParams) -> bool:
        """Whether a row with these params is affected; the batch skips the class when no row is."""
        raise NotImplementedError

    @staticmethod
    def validate(params: SamplingParams, vocab_size: int) -> None:
        """Check the params this processor reads; raises InvalidParamError naming the field."""
        return None

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Transform ``logits`` ([B, V] f32, may be modified in place) and return the result."""
        raise NotImplementedError

    def rows(self) -> list[int]:
        """Indices of the rows this processor affects in this batch."""
        return [i for i, p in enumerate(self.metadata.params) if self.needs(p)]


def _check_token_ids(ids: Iterable[int], vocab_size: int, param: str) -> None:
    for token_id in ids:
        if not isinstance(token_id, int) or not 0 <= token_id < vocab_size:
            raise InvalidParamError(f"{param} contains token id {token_id!r} outside [0, {vocab_size})",
                                    param=param)


class AllowedTokenIdsLogitsProcessor(LogitsProcessor):
    """Only the row's ``allowed_token_ids`` keep their logits; every other token gets -inf."""

    name = "allowed_token_ids"
    is_mask = True

    def __init__(self, metadata: SamplingMetadata) -> None:
        super().__init__(metadata)
        rows = self.rows()
        device = metadata.device
        # [R, V] True where the token is forbidden.
        self.forbidden = torch.ones(len(rows), metadata.vocab_size, dtype=torch.bool)
        for j, row in enumerate(rows):
            self.forbidden[j, metadata.params[row].allowed_token_ids] = False
        self.forbidden = to_device(self.forbidden, device)
        self.row_index = to_device(torch.tensor(rows, dtype=torch.int64), device)

    @classmethod
    def needs(cls, params: SamplingParams) -> bool:
        return params.allowed_token_ids is not None

    @staticmethod
    def validate(params: SamplingParams, vocab_size: int) -> None:
        if params.allowed_token_ids is not None:
            _check_token_ids(params.allowed_token_ids, vocab_size, "allowed_token_ids")

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        logits[self.row_index] = logits[self.row_index].masked_fill(self.forbidden, _NEG_INF)
        return logits


class BadWordsLogitsProcessor(LogitsProcessor):
    """Forbid completing any bad word (vLLM semantics over ``params.bad_words_token_ids``).

    A one-token bad word is always masked. A word of n > 1 tokens has its last token masked when the
    row's last n-1 output tokens equal its first n-1 tokens. Under overlapped scheduling the last of those may
    be the row's pending token, still on the device (``SamplingMetadata.pending_token_ids``): the host checks
    the n-2 tokens before it, and the device compares the pending token with the word's (n-1)-th, so the mask
    is the one a step at a time would give, without waiting for the token.
    """

    name = "bad_words"
    is_mask = True

    def __init__(self, metadata: SamplingMetadata) -> None:
        super().__init__(metadata)
        rows: list[int] = []
        cols: list[int] = []
        # Words whose match hangs on the pending token: (row, token it must equal, token to mask).
        pending: tuple[list[int], list[int], list[int]] = ([], [], [])
        for row in self.rows():
            output = metadata.output_token_ids[row]
            has_pending = metadata.num_pending[row] > 0
            for word in metadata.params[row].bad_words_token_ids or ():
                prefix_len = len(word) - 1
                if prefix_len == 0:
                    rows.append(row)
                    cols.append(word[-1])
                elif not has_pending:
                    if len(output) >= prefix_len and output[-prefix_len:] == word[:-1]:
                        rows.append(row)
                        cols.append(word[-1])
                elif len(output) >= prefix_len - 1 and (prefix_len == 1 or output[-(prefix_len - 1):] == word[:-2]):
                    for values, value in zip(pending, (row, word[-2], word[-1])):
                        values.append(value)
        device = metadata.device
        self.rows_index = to_device(torch.tensor(rows, dtype=torch.int64), device)
        self.cols_index = to_device(torch.tensor(cols, dtype=torch.int64), device)
        self.pending = None
        if pending[0]:
            assert metadata.pending_token_ids is not None  # built for every row that reads its output tokens
            self.pending = tuple(to_device(torch.tensor(v, dtype=torch.int64), device) for v in pending)

    @classmethod
    def needs(cls, params: SamplingParams) -> bool:
        return bool(params.bad_words_token_ids)

    @staticmethod
    def validate(params: SamplingParams, vocab_size: int) -> None:
        if params.bad_words and params.bad_words_token_ids is None:
            # A front-end bug, not a user error: the words were never tokenized.
            raise ValueError("bad_words must be tokenized into bad_words_token_ids before sampling")
        for word in params.bad_words_token_ids or ():
            if not word:
                raise InvalidParamError("bad_words contains an empty word", param="bad_words")
            _check_token_ids(word, vocab_size, "bad_words")

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        mask_positions(logits, self.rows_index, self.cols_index)
        if self.pending is not None:
            rows, must_equal, masked = self.pending
            matched = (self.metadata.pending_token_ids[rows] == must_equal).to(torch.int32)  # [W], on the device
            hits = torch.zeros_like(logits, dtype=torch.int32)
            hits.index_put_((rows, masked), matched, accumulate=True)  # a token two words mask is counted twice
            logits.masked_fill_(hits > 0, _NEG_INF)
        return logits


class LogitBiasLogitsProcessor(LogitsProcessor):
    """OpenAI ``logit_bias``: add the row's bias for each listed token id to its logit."""

    name = "logit_bias"

    def __init__(self, metadata: SamplingMetadata) -> None:
        super().__init__(metadata)
        rows: list[int] = []
        cols: list[int] = []
        values: list[float] = []
        for row in self.rows():
            for token_id, bias in metadata.params[row].logit_bias.items():
                rows.append(row)
                cols.append(int(token_id))
                values.append(float(bias))
        device = metadata.device
        self.index = (to_device(torch.tensor(rows, dtype=torch.int64), device),
                      to_device(torch.tensor(cols, dtype=torch.int64), device))
        self.values = to_device(torch.tensor(values, dtype=torch.float32), device)

    @classmethod
    def needs(cls, params: SamplingParams) -> bool:
        return bool(params.logit_bias)

    @staticmethod
    def validate(params: SamplingParams, vocab_size: int) -> None:
        for token_id, bias in (params.logit_bias or {}).items():
            try:
                as_int = int(token_id)
            except (TypeError, ValueError):
                raise InvalidParamError(f"logit_bias key {token_id!r} is not a token id",
                                        param="logit_bias") from None
            if not 0 <= as_int < vocab_size:
                raise InvalidParamError(f"logit_bias contains token id {as_int} outside [0, {vocab_size})",
                                        param="logit_bias")
            if not isinstance(bias, (int, float)) or not math.isfinite(bias) or abs(bias) > _MAX_ABS_LOGIT_BIAS:
                raise InvalidParamError(f"logit_bias value for token {as_int} must be in [-100, 100]",
                                        param="logit_bias")

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.index_put_(self.index, self.values, accumulate=True)


class MinTokensLogitsProcessor(LogitsProcessor):
    """Mask EOS and ``stop_token_ids`` while the row has fewer than ``min_tokens`` output tokens (its pending
    token, under overlapped scheduling, counted: only how many there are matters, not their values)."""

    name = "min_tokens"

    def __init__(self, metadata: SamplingMetadata) -> None:
        super().__init__(metadata)
        rows: list[int] = []
        cols: list[int] = []
        for row in self.rows():
            params = metadata.params[row]
            if len(metadata.output_token_ids[row]) + metadata.num_pending[row] < params.min_tokens:
                stop_ids = params.all_stop_token_ids(metadata.eos_token_ids[row])
                rows.extend([row] * len(stop_ids))
                cols.extend(sorted(stop_ids))
        self.rows_index = to_device(torch.tensor(rows, dtype=torch.int64), metadata.device)
        self.cols_index = to_device(torch.tensor(cols, dtype=torch.int64), metadata.device)

    @classmethod
    def needs(cls, params: SamplingParams) -> bool:
        return params.min_tokens > 0

    @staticmethod
    def validate(params: SamplingParams, vocab_size: int) -> None:
        _check_token_ids(params.stop_token_ids, vocab_size, "stop_token_ids")

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        mask_positions(logits, self.rows_index, self.cols_index)
        return logits


class MinPLogitsProcessor(LogitsProcessor):
    """min-p (Nguyen et al. 2024): drop tokens whose probability is below ``min_p`` times the top one.

    Argmax-invariant, so it runs after temperature on random rows only.
    """

    name = "min_p"
    is_argmax_invariant = True

    def __init__(self, metadata: SamplingMetadata) -> None:
        super().__init__(metadata)
        min_p = metadata.min_p
        if min_p is None:  # the metadata skipped it (no random row uses min_p): rebuild for this step
            min_p = to_device(torch.tensor([p.min_p if self.needs(p) else 0.0 for p in metadata.params],
                                 dtype=torch.float32), metadata.device)
        self.min_p = min_p.unsqueeze(1)  # [B, 1]

    @classmethod
    def needs(cls, params: SamplingParams) -> bool:
        return params.min_p > 0.0 and not params.greedy

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        probs = logits.softmax(dim=-1)
        threshold = probs.amax(dim=-1, keepdim=True) * self.min_p
        return logits.masked_fill_(probs < threshold, _NEG_INF)


# Name -> class, in the order the Sampler applies them within each stage.
BUILTIN_LOGITS_PROCESSORS: dict[str, type[LogitsProcessor]] = {
    cls.name: cls for cls in (AllowedTokenIdsLogitsProcessor, BadWordsLogitsProcessor,
                              LogitBiasLogitsProcessor, MinTokensLogitsProcessor, MinPLogitsProcessor)
}


def validate_logits_processor_params(params: SamplingParams, vocab_size: int,
                                     extra: Iterable[type[LogitsProcessor]] = ()) -> None:
    """Run every processor's ``validate`` (built-ins, then ``extra``); the front end calls it per request.

    Raises: InvalidParamError naming the bad field.
    """
    for cls in [*BUILTIN_LOGITS_PROCESSORS.values(), *extra]:
        cls.validate(params, vocab_size)
