"""What one prompt of a request produced, folded from the engine's DELTA outputs: its choices' text, tokens,
logprobs and finish reasons, its prompt logprobs and cached-token count."""

from __future__ import annotations

from dataclasses import dataclass, field

from brigade.interfaces import CompletionOutput, Logprob, RequestOutput


@dataclass
class ChoiceState:
    """One choice (one of the n sequences of one prompt) accumulated from DELTA outputs."""

    text_parts: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, Logprob]] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def add(self, delta: CompletionOutput) -> None:
        self.text_parts.append(delta.text)
        self.token_ids.extend(delta.token_ids)
        if delta.logprobs:
            self.logprobs.extend(delta.logprobs)
        if delta.finish_reason is not None:
            self.finish_reason = delta.finish_reason
            self.stop_reason = delta.stop_reason

    @property
    def text(self) -> str:
        return "".join(self.text_parts)


@dataclass
class PromptResult:
    """Everything one prompt produced: its token ids, cached-token count and its n choices."""

    prompt_token_ids: list[int]
    num_cached_tokens: int = 0
    choices: dict[int, ChoiceState] = field(default_factory=dict)
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None  # with prompt_logprobs: None, then per token

    def add(self, output: RequestOutput) -> list[CompletionOutput]:
        """Fold one DELTA RequestOutput in; returns its per-choice deltas."""
        self.num_cached_tokens = output.num_cached_tokens
        if output.prompt_logprobs is not None:
            self.prompt_logprobs = output.prompt_logprobs
        for delta in output.outputs:
            self.choices.setdefault(delta.index, ChoiceState()).add(delta)
        return list(output.outputs)

    def num_generated_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.choices.values())
