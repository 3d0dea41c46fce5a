"""Incremental detokenization and stop strings.

Text is decoded token by token with tokenizers' DecodeStream, which buffers partial UTF-8 sequences.
Stop strings are searched only in the window the new text can complete, and a stream holds back the
last ``len(longest stop) - 1`` characters, so no client ever sees part of a stop string.
"""

from __future__ import annotations

from tokenizers.decoders import DecodeStream

from brigade.sampling_params import SamplingParams

# Prompt tokens fed to the decoder first, so the first output token decodes with its real left context
# (sentencepiece drops a leading space at the start of a text). The server's logprobs text offsets decode with
# the same context (entrypoints/openai/text_offsets.py).
PROMPT_CONTEXT_TOKENS = 4


class IncrementalDetokenizer:
    """Decodes one sequence's output tokens and finds its stop strings.

    Invariant: ``output_text`` is the decoded output so far, already cut at a stop string if one matched.
    """

    def __init__(self, tokenizer, prompt_token_ids: list[int], params: SamplingParams):
        # Without a tokenizer (or with detokenize=False) the text stays empty; token ids still flow.
        self._enabled = tokenizer is not None and params.detokenize
        if self._enabled:
            self._backend = tokenizer.backend_tokenizer
            self._stream = DecodeStream(skip_special_tokens=params.skip_special_tokens)
            for token_id in prompt_token_ids[-PROMPT_CONTEXT_TOKENS:]:
                self._stream.step(self._backend, token_id)
        self.params = params
        self.output_text = ""
        self.stop = params.stop
        self.min_tokens = params.min_tokens
        self.num_output_tokens = 0
        # Tokens of the last update that came after the stop string (several tokens in one step, as with
        # speculative decoding); the caller drops them, so the output ends where one token per step would.
        self.num_tokens_after_stop = 0
        self._sent_offset = 0
        self.stop_buffer_length = 0
        if self.stop and not params.include_stop_str_in_output:
            self.stop_buffer_length = max(len(s) for s in self.stop) - 1

    def update(self, new_token_ids: list[int], skip_last: bool) -> str | None:
        """Decode new tokens and look for a stop string.

        Args:
            new_token_ids: tokens from this step.
            skip_last: the last token ended the request as EOS or a stop token; its text is not shown
                unless include_stop_str_in_output.
        Returns:
            The stop string that matched (the text is then truncated), or None.
        """
        num_new_chars = 0
        if not self._enabled:
            self.num_output_tokens += len(new_token_ids)
            return None
        if self.stop and len(new_token_ids) > 1:  # check after each token, as if they had come one per step
            for i, token_id in enumerate(new_token_ids):
                stop = self.update([token_id], skip_last=skip_last and i == len(new_token_ids) - 1)
                if stop is not None:
                    self.num_tokens_after_stop = len(new_token_ids) - 1 - i
                    return stop
            return None
        for i, token_id in enumerate(new_token_ids):
            self.num_output_tokens += 1
            if skip_last and i == len(new_token_ids) - 1 and not self.params.include_stop_str_in_output:
                continue
            piece = self._stream.step(self._backend, token_id)
            if piece:
                self.output_text += piece
                num_new_chars += len(piece)
        if not self.stop or num_new_chars == 0 or self.num_output_tokens < self.min_tokens:
            return None
        return self._check_stop_strings(num_new_chars)

    def _check_stop_strings(self, num_new_chars: int) -> str | None:
        best: tuple[int, str] | None = None
        text = self.output_text
        for stop in self.stop:
            # Only a match that ends inside the new text can be new.
            start = max(0, len(text) - num_new_chars - len(stop) + 1)
            idx = text.find(stop, start)
            if idx != -1 and (best is None or idx < best[0]):
                best = (idx, stop)
        if best is None:
            return None
        idx, stop = best
        self.output_text = text[:idx + len(stop)] if self.params.include_stop_str_in_output else text[:idx]
        return stop

    def get_text(self, finished: bool, delta: bool) -> str:
        """The text to show now: the whole text, or only what is new since the last call when ``delta``."""
        end = len(self.output_text) if finished else max(0, len(self.output_text) - self.stop_buffer_length)
        if not delta:
            return self.output_text[:end]
        end = max(end, self._sent_offset)
        text = self.output_text[self._sent_offset:end]
        self._sent_offset = end
        return text
