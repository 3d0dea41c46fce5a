"""StructuredTextProcessor: ``{"data": {"text": ...}}`` (or ``"texts": [...]``) in; per input the
completion, its finish reason, token counts and the completion split into sentences out."""

from __future__ import annotations

import re
from typing import Any

from brigade.interfaces import RequestOutput
from brigade.plugins.io_processor import IOProcessor, IOProcessorRequest
from brigade.sampling_params import InvalidParamError, SamplingParams

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
_PARAM_FIELDS = ("max_tokens", "temperature", "top_p", "seed")


def split_sentences(text: str) -> list[str]:
    """Split at whitespace that follows ., ! or ?; drops empty pieces."""
    return [s.strip() for s in _SENTENCE_END.split(text) if s.strip()]


class StructuredTextProcessor(IOProcessor):
    """Request body::

        {"data": {"text": "..."} | {"texts": ["...", ...]},
         "params": {"max_tokens": 64, "temperature": 0.0, "top_p": 1.0, "seed": 0}}   # params optional

    Response body::

        {"data": [{"input": str, "completion": str, "finish_reason": str, "sentences": [str],
                   "num_prompt_tokens": int, "num_completion_tokens": int}],
         "usage": {"prompt_tokens": int, "completion_tokens": int}}
    """

    def parse_request(self, data: Any) -> IOProcessorRequest:
        if not isinstance(data, dict) or not isinstance(data.get("data"), dict):
            raise ValueError('body must be {"data": {"text": str}} or {"data": {"texts": [str, ...]}}')
        inner = data["data"]
        if "text" in inner and "texts" in inner:
            raise ValueError('give "text" or "texts", not both')
        texts = [inner["text"]] if "text" in inner else inner.get("texts")
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t for t in texts):
            raise ValueError('"text" must be a non-empty string and "texts" a non-empty list of them')
        params = data.get("params", {})
        if not isinstance(params, dict) or set(params) - set(_PARAM_FIELDS):
            raise ValueError(f'"params" may hold only {sorted(_PARAM_FIELDS)}')
        try:  # SamplingParams checks each value's type and range (no coercion: "5" or [1] is refused)
            sampling_params = SamplingParams(**{"max_tokens": 64, **params})
        except InvalidParamError as exc:
            raise InvalidParamError(f"params.{exc.param}: {exc}", param=f"params.{exc.param}") from None
        return IOProcessorRequest(prompts=list(texts), sampling_params=sampling_params)

    def post_process(self, request: IOProcessorRequest, outputs: list[RequestOutput]) -> dict[str, Any]:
        if len(outputs) != len(request.prompts):
            raise ValueError(f"{len(outputs)} outputs for {len(request.prompts)} prompts")
        items = []
        for prompt, output in zip(request.prompts, outputs):
            completion = output.outputs[0]
            items.append({"input": prompt, "completion": completion.text,
                          "finish_reason": completion.finish_reason,
                          "sentences": split_sentences(completion.text),
                          "num_prompt_tokens": len(output.prompt_token_ids),
                          "num_completion_tokens": len(completion.token_ids)})
        return {"data": items,
                "usage": {"prompt_tokens": sum(i["num_prompt_tokens"] for i in items),
                          "completion_tokens": sum(i["num_completion_tokens"] for i in items)}}
