"""Sampler: turns a step's logits into one token id per request, in vLLM v1's sampler order.

Order (the order is the semantics):
  1. logprobs from the raw logits;          2. cast to fp32;
  3. masks: allowed tokens, bad words, grammar bitmask;
  4. processors that are not argmax-invariant (logit_bias, min_tokens, plugins);
  5. penalties (repetition, frequency, presence);
  6. greedy shortcut (argmax) for greedy rows;   7. temperature;
  8. argmax-invariant processors (min_p);        9. top-k / top-p;
  10. random draw (exponential race; seeded rows use their own generator).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from brigade.sample.argmax import argmax_rows
from brigade.sample.fused import FusedSampler, fused_sampler
from brigade.sample.logits_processors import BUILTIN_LOGITS_PROCESSORS, LogitsProcessor
from brigade.sample.logprobs import LogprobsTensors, compute_logprobs, gather_logprobs
from brigade.sample.metadata import SamplingMetadata
from brigade.sample.penalties import apply_penalties
from brigade.sample.structured import apply_grammar_bitmask
from brigade.sample.topk_topp import apply_top_k_top_p, random_sample

__all__ = ["Sampler", "SamplerOutput", "TargetLogits", "argmax_rows"]

logger = logging.getLogger(__name__)

@dataclass(slots=True)
class SamplerOutput:
    """What one sampling step produces.

    Attributes:
        sampled_token_ids: [B] int64, one token per row.
        logprobs: raw-logit logprobs of the sampled token and the top ``max_num_logprobs``, or None
            when no row asked for logprobs.
    """

    sampled_token_ids: torch.Tensor
    logprobs: LogprobsTensors | None


@dataclass(slots=True)
class TargetLogits:
    """The distribution the Sampler would draw from, before the draw (speculative decoding verifies drafts
    against it: ``brigade.sample.rejection_sampler``).

    Attributes:
        greedy: [B] int64 argmax after masks, processors and penalties (step 6), or None when no row is greedy.
        warped: [B, V] f32 logits after temperature, min_p and top-k/top-p (steps 7-9; -inf = never drawn),
            or None when every row is greedy. Rows of greedy rows are unspecified.
        raw_logprobs: [B, V] f32 log_softmax of the raw logits (step 1), or None when no row asked.
    """

    greedy: torch.Tensor | None
    warped: torch.Tensor | None
    raw_logprobs: torch.Tensor | None


class Sampler(nn.Module):
    """Stateless sampler: all per-batch state comes in the SamplingMetadata.

    Args:
        extra_logits_processors: processor classes contributed by plugins. Built-in classes in it are
            ignored (they always run, at their fixed place), so the whole registry may be passed.
            Each class runs at the stage its ``is_mask`` / ``is_argmax_invariant`` flags select, after
            the built-ins of that stage.
        descriptions: plugin class -> how errors name it (``"logits processor 'x' from plugin 'x' (dist 1.0)"``);
            a class left out is named by its ``name`` attribute.

    A plugin's processor that raises (in ``needs``, ``__init__`` or ``apply``) does not stop the step: the rows it
    affects are recorded in ``metadata.processor_errors`` with a line naming the processor, and their requests
    are failed by the caller; the other rows are sampled as usual (unless the processor wrote to them before it
    raised, which the LogitsProcessor contract forbids). A built-in's error propagates (a bug of the engine).
    """

    def __init__(self, extra_logits_processors: Sequence[type[LogitsProcessor]] = (),
                 descriptions: dict[type[LogitsProcessor], str] | None = None) -> None:
        super().__init__()
        builtins = list(BUILTIN_LOGITS_PROCESSORS.values())
        classes = builtins + [c for c in dict.fromkeys(extra_logits_processors) if c not in builtins]
        self.plugin_processors = frozenset(classes[len(builtins):])
        self.descriptions = dict(descriptions or {})
        self.mask_processors = [c for c in classes if c.is_mask]
        self.non_argmax_invariant_processors = [c for c in classes
                                                if not c.is_mask and not c.is_argmax_invariant]
        self.argmax_invariant_processors = [c for c in classes if c.is_argmax_invariant and not c.is_mask]
        self._fused: dict[str, FusedSampler | None] = {}  # logits device type -> its kernel, bound on first use

    def forward(self, logits: torch.Tensor, metadata: SamplingMetadata) -> SamplerOutput:
        """Sample one token per row.

        Args:
            logits: [B, V] in the model dtype; not modified.
            metadata: the step's SamplingMetadata with B rows.

        Returns: SamplerOutput with [B] int64 ids and, if any row asked, LogprobsTensors with
        ``max_num_logprobs + 1`` columns.
        """
        device_type = logits.device.type
        if device_type not in self._fused:
            self._fused[device_type] = fused_sampler(device_type)
        fused = self._fused[device_type]
        if fused is not None and self._plain(metadata):  # the same steps in one pass (sample/fused.py)
            temperature = None if metadata.all_greedy else metadata.temperature
            return SamplerOutput(fused(logits, temperature, greedy=metadata.all_greedy), None)
        # (1) Logprobs must describe the model's distribution, so they are taken before any change.
        raw_logprobs = compute_logprobs(logits) if metadata.max_num_logprobs is not None else None
        logits = self._process(logits, metadata)  # (2)-(5)
        sampled = self._sample(logits, metadata)  # (6)-(10)
        logprobs = None
        if raw_logprobs is not None:
            logprobs = gather_logprobs(raw_logprobs, metadata.max_num_logprobs, sampled)
        return SamplerOutput(sampled_token_ids=sampled, logprobs=logprobs)

    def target_logits(self, logits: torch.Tensor, metadata: SamplingMetadata) -> TargetLogits:
        """Steps 1-9 without the draw: the target distribution of each row, as ``forward`` would sample it.

        Args:
            logits: [B, V] in the model dtype; not modified.
            metadata: B rows.
        Returns: TargetLogits (greedy argmax, warped logits, raw logprobs) with B rows.
        """
        raw_logprobs = compute_logprobs(logits) if metadata.max_num_logprobs is not None else None
        logits = self._process(logits, metadata)
        greedy = None if metadata.all_random else argmax_rows(logits)
        warped = None if metadata.all_greedy else self._warp(logits, metadata)
        return TargetLogits(greedy=greedy, warped=warped, raw_logprobs=raw_logprobs)

    def _process(self, logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
        """Steps 2-5: fp32 copy, masks, processors that can change the argmax, penalties."""
        # (2) fp32 from here on; copy=True so the caller's tensor is never written.
        logits = logits.to(torch.float32, copy=True)
        # (3) Masks.
        logits = self._apply_processors(logits, metadata, self.mask_processors)
        if metadata.grammar_bitmask is not None:
            logits = apply_grammar_bitmask(logits, metadata.grammar_bitmask)
        # (4) Processors that can change the argmax.
        logits = self._apply_processors(logits, metadata, self.non_argmax_invariant_processors)
        # (5) Penalties, before the greedy pick and before temperature.
        if metadata.penalties is not None:
            logits = apply_penalties(logits, metadata.penalties)
        return logits

    def _warp(self, logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
        """Steps 7-9 in place: temperature, argmax-invariant processors (min_p), top-k/top-p."""
        if metadata.temperature is not None:  # None: every row at temperature 1.0
            logits.div_(metadata.temperature.unsqueeze(1))
        logits = self._apply_processors(logits, metadata, self.argmax_invariant_processors)
        return apply_top_k_top_p(logits, metadata.top_k, metadata.top_p)

    def _sample(self, logits: torch.Tensor, metadata: SamplingMetadata) -> torch.Tensor:
        """Steps 6-10: greedy argmax, temperature, argmax-invariant processors, top-k/top-p, draw."""
        if metadata.all_greedy:
            return argmax_rows(logits)
        greedy = None if metadata.all_random else argmax_rows(logits)
        logits = self._warp(logits, metadata)
        sampled = random_sample(logits, metadata.generators)
        if greedy is None:
            return sampled
        return torch.where(metadata.is_greedy, greedy, sampled)

    def _plain(self, metadata: SamplingMetadata) -> bool:
        """True when the order above reduces to fp32, temperature and the argmax or the race (``fused.py``):
        all rows greedy or all random with only a temperature, and nothing that reads or changes logits."""
        md = metadata
        if md.max_num_logprobs is not None or md.grammar_bitmask is not None or md.penalties is not None:
            return False
        classes = self.mask_processors + self.non_argmax_invariant_processors
        if not md.all_greedy:
            if not (md.all_random and md.top_k is None and md.top_p is None and md.min_p is None
                    and not md.generators):
                return False
            classes = classes + self.argmax_invariant_processors
        try:
            return not any(cls.needs(p) for cls in classes for p in md.params)
        except Exception:  # a plugin's needs() failed: the unfused path names it (_apply_processors)
            return False

    def describe(self, cls: type[LogitsProcessor]) -> str:
        """How an error names a processor: its plugin and distribution when known."""
        return self.descriptions.get(cls) or f"logits processor {cls.name or cls.__name__!r}"

    def _apply_processors(self, logits: torch.Tensor, metadata: SamplingMetadata,
                          classes: list[type[LogitsProcessor]]) -> torch.Tensor:
        for cls in classes:
            if cls not in self.plugin_processors:
                if any(cls.needs(p) for p in metadata.params):
                    logits = cls(metadata).apply(logits)
                continue
            rows: list[int] = []
            for row, params in enumerate(metadata.params):
                try:
                    if cls.needs(params):
                        rows.append(row)
                except Exception as exc:
                    self._fail_rows(metadata, cls, "needs", exc, [row])
            rows = [row for row in rows if row not in metadata.processor_errors]
            if not rows:
                continue
            stage = "__init__"
            try:
                processor = cls(metadata)
                stage = "apply"
                result = processor.apply(logits)
                if not isinstance(result, torch.Tensor) or result.shape != logits.shape:
                    raise TypeError(f"returned {type(result).__name__} "
                                    f"{tuple(result.shape) if isinstance(result, torch.Tensor) else ''}, "
                                    f"not the [B, V] logits tensor {tuple(logits.shape)}")
                logits = result
            except Exception as exc:
                self._fail_rows(metadata, cls, stage, exc, rows)
        return logits

    def _fail_rows(self, metadata: SamplingMetadata, cls: type[LogitsProcessor], stage: str, exc: Exception,
                   rows: list[int]) -> None:
        message = f"{self.describe(cls)} raised in {stage}(): {type(exc).__name__}: {exc}"
        logger.error("%s (rows %s of the step; their requests fail, the engine goes on)", message, rows,
                     exc_info=exc)
        for row in rows:
            metadata.processor_errors.setdefault(row, message)
