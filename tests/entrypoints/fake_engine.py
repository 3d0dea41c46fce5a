"""FakeEngine: follows the AsyncLLM contract with scripted outputs, for HTTP-shape tests only.

It exists to reach states a healthy real engine never shows on demand: a core that dies in the middle
of a stream, or one that is already dead. Everything about real generation is tested against the real
engine (test_openai_server.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from brigade.engine.async_llm import EngineDeadError
from brigade.interfaces import CompletionOutput, RequestOutput
from brigade.sampling_params import SamplingParams


class FakeEngine:
    """Emits the prompt's own tokens back, one per step (DELTA), and can die after ``die_after`` tokens."""

    def __init__(self, tokenizer, *, max_model_len: int = 256, die_after: int | None = None):
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.die_after = die_after
        self.dead = False
        self.aborted: list[str] = []
        self.stat_loggers = []
        self.hf_config = None  # no model config: build_app mounts no IO processor

    @property
    def errored(self) -> bool:
        return self.dead

    async def generate(self, prompt: str | list[int], sampling_params: SamplingParams, request_id: str, *,
                       priority: int = 0, cache_salt: str | None = None) -> AsyncIterator[RequestOutput]:
        await self.check_health()
        token_ids = list(prompt) if not isinstance(prompt, str) else self.tokenizer(prompt)["input_ids"]
        for step in range(sampling_params.max_tokens):
            await asyncio.sleep(0)
            if self.die_after is not None and step == self.die_after:
                self.dead = True
                raise EngineDeadError("the engine process died (exit code -9)")
            token = token_ids[step % len(token_ids)]
            last = step == sampling_params.max_tokens - 1
            yield RequestOutput(request_id=request_id, prompt=None, prompt_token_ids=token_ids, finished=last,
                                outputs=[CompletionOutput(index=0, text=self.tokenizer.decode([token]),
                                                          token_ids=[token],
                                                          finish_reason="length" if last else None)])

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    async def check_health(self) -> None:
        if self.dead:
            raise EngineDeadError("the engine process died (exit code -9)")

    async def get_kv_cache_stats(self) -> dict:
        return {"num_free_blocks": 10, "num_total_blocks": 10}

    async def get_kv_cache_stats_by_engine(self) -> list[dict]:
        return [await self.get_kv_cache_stats()]

    def add_stat_logger(self, stat_logger) -> None:
        self.stat_loggers.append(stat_logger)

    def shutdown(self) -> None:
        pass
