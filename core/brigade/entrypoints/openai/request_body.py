"""Reading a request's JSON body into its pydantic model, so that every malformed body is a 400 naming its field."""

from __future__ import annotations

from typing import Any

from fastapi import Request
from pydantic import BaseModel, ValidationError

from brigade.entrypoints.openai.errors import from_invalid_param, from_validation_error
from brigade.entrypoints.openai.protocol import parse_json_body
from brigade.sampling_params import InvalidParamError


async def parse_request(raw_request: Request, model_cls: type[BaseModel]) -> Any:
    """Read and validate a JSON body ourselves, so that malformed JSON and bad types are 400s with param.

    Raises:
        OpenAIError: 400 for an empty, non-JSON or ill-typed body.
    """
    try:
        data = parse_json_body(await raw_request.body())
        if not isinstance(data, dict):
            raise InvalidParamError("the request body must be a JSON object", param=None)
        _check_unicode(data)
        return model_cls.model_validate(data)
    except RecursionError:
        raise from_invalid_param(InvalidParamError("the request body is nested too deeply", param=None)) from None
    except InvalidParamError as exc:
        raise from_invalid_param(exc) from None
    except ValidationError as exc:
        raise from_validation_error(exc) from None


def _check_unicode(data: Any) -> None:
    """Refuse strings that are not valid Unicode (lone surrogates from JSON escapes), which no tokenizer
    or encoder downstream can take. Walks with an explicit stack, so depth cannot overflow it.

    Raises:
        InvalidParamError: naming the top-level field that holds the bad string.
    """
    stack = [(key, value) for key, value in data.items()] if isinstance(data, dict) else [(None, data)]
    while stack:
        top, value = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidParamError("strings must be valid Unicode (a lone surrogate such as \\ud800 is "
                                        "not)", param=top) from None
        elif isinstance(value, dict):
            stack.extend((top, v) for v in value.values())
            stack.extend((top, k) for k in value)
        elif isinstance(value, list):
            stack.extend((top, v) for v in value)
