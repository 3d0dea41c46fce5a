"""Where each token's text starts in a completion's text: the legacy logprobs' ``text_offset`` (OpenAI, vLLM).

Offsets count characters of the text the response returns. A token that holds only part of a character
(byte-level BPE spreads an emoji over several tokens, each decoding alone to U+FFFD) starts where that character
starts, so the offsets never decrease and a stream gets the same ones as a whole response, whatever tokens its
chunks carry. They come from decoding the tokens as the engine's detokenizer does (the tokenizers decoder, with
the prompt's last tokens as left context), one token at a time from the last whole character; the length of a
decoded token (with its U+FFFD) is never used.

A server without a tokenizer (``--skip-tokenizer-init``) returns no text, so every token's offset is where the
(empty) text starts, as vLLM's are then.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from brigade.engine.detokenizer import PROMPT_CONTEXT_TOKENS

REPLACEMENT = "\ufffd"
MAX_PENDING_TOKENS = 4
"""Tokens that can hold parts of one character (UTF-8 has at most 4 bytes a character). Text still ending in
U+FFFD after that many is a real U+FFFD (or bytes that never make a character) and counts as whole."""


class TextOffsets:
    """The text offsets of one sequence's tokens, fed in order (a whole output, or a stream's chunks one by one).

    Args:
        tokenizer: the server's HF tokenizer (its ``backend_tokenizer`` decodes, as the engine's detokenizer), or
            None for a server without one: every token then decodes to "" and its offset is ``start``.
        start: the offset of the first token's text (the echoed prompt's length before a completion).
        context: the tokens before the first (the prompt), which decide how the first token decodes.
        skip_special_tokens: as the request's, so that special tokens count as they show in the text.
    """

    def __init__(self, tokenizer: Any, *, start: int = 0, context: Sequence[int] = (),
                 skip_special_tokens: bool = True):
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._decoder = backend if backend is not None else tokenizer
        self._skip = skip_special_tokens
        self._context = list(context)[-PROMPT_CONTEXT_TOKENS:]
        self._context_text = self.decode(self._context)
        self._pending: list[int] = []  # the tokens since the last whole character
        self._pending_chars = 0  # the whole characters they decode to so far
        self._anchor = start  # where the pending tokens' text starts
        self._last = start

    def decode(self, token_ids: list[int]) -> str:
        """The tokens' text, as this tracker decodes them (no left context); "" without a tokenizer."""
        if not token_ids or self._decoder is None:
            return ""
        return self._decoder.decode(token_ids, skip_special_tokens=self._skip)

    def _pending_text(self) -> str:
        """The pending tokens' text, decoded after the context (a leading space survives, as in the engine)."""
        full = self.decode(self._context + self._pending)
        if full.startswith(self._context_text):
            return full[len(self._context_text):]
        return self.decode(self._pending)  # a context that ends inside a character: decode the tokens alone

    def offsets(self, token_ids: Sequence[int]) -> list[int]:
        """The offsets of the next tokens of the sequence (non-decreasing, continuing the previous calls')."""
        out = []
        for token_id in token_ids:
            self._last = max(self._last, self._anchor + self._pending_chars)
            out.append(self._last)
            self._pending.append(token_id)
            text = self._pending_text()
            whole = len(text.rstrip(REPLACEMENT))
            if whole == len(text) or len(self._pending) >= MAX_PENDING_TOKENS:
                self._anchor += len(text)
                self._context = (self._context + self._pending)[-PROMPT_CONTEXT_TOKENS:]
                self._context_text = self.decode(self._context)
                self._pending, self._pending_chars = [], 0
            else:
                self._pending_chars = whole
        return out


def prompt_offsets(tokenizer: Any, token_ids: Sequence[int], text: str) -> list[int]:
    """The text offsets of a prompt's tokens in ``text``, the prompt as it is echoed.

    Special tokens count as their text (a prompt's own "<|im_start|>" is in it), except a prefix the tokenizer
    added that the text does not hold (a BOS): its tokens start at 0. Every offset is within the text (0 for
    every token when ``tokenizer`` is None: the prompt is then echoed as no text).
    """
    tracker = TextOffsets(tokenizer, skip_special_tokens=False)
    offsets = tracker.offsets(token_ids)
    decoded = tracker.decode(list(token_ids))
    shift = len(decoded) - len(text) if len(decoded) > len(text) and decoded.endswith(text) else 0
    return [min(max(o - shift, 0), len(text)) for o in offsets]
