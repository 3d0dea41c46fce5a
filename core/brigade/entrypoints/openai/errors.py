"""Errors of the OpenAI-compatible server and the handlers that give every error OpenAI's shape.

Every error body is ``{"error": {"message", "type", "param", "code"}}``. Status codes: 400 for a bad
parameter (``param`` names it; FastAPI's 422 is never used), 401 for a bad API key, 404 for an unknown
model or route, 503 while the engine is dead, 500 only for a bug.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from brigade.entrypoints.openai.responses import ErrorInfo, ErrorResponse
from brigade.lora.request import name_list
from brigade.sampling_params import InvalidParamError

logger = logging.getLogger(__name__)


class OpenAIError(Exception):
    """An error the server reports to the client as-is, with its HTTP status and OpenAI fields."""

    def __init__(self, message: str, *, status_code: int = 400, type: str = "invalid_request_error",
                 param: str | None = None, code: int | str | None = None):
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.type = type
        self.param = param
        self.code = code if code is not None else status_code

    def to_response(self) -> ErrorResponse:
        return ErrorResponse(error=ErrorInfo(message=self.message, type=self.type, param=self.param,
                                             code=self.code))

    @classmethod
    def bad_param(cls, message: str, param: str | None) -> "OpenAIError":
        """400 invalid_request_error naming the field at fault."""
        return cls(message, status_code=400, param=param)

    @classmethod
    def not_supported(cls, what: str, param: str) -> "OpenAIError":
        """400 for a field Brigade parses but does not serve yet (so it is never silently ignored)."""
        return cls(f"{what} is not supported yet by this server", status_code=400, param=param,
                   code="not_supported")

    @classmethod
    def model_not_found(cls, model: str, served: str | Sequence[str], adapters: Sequence[str] = ()) -> "OpenAIError":
        """404 ``model_not_found``, naming the served model (each of its ``--served-model-name`` names) and its
        LoRA adapters."""
        names = [served] if isinstance(served, str) else list(served)
        also = f" and the LoRA adapters {name_list(adapters)}" if adapters else ""
        return cls(f"The model {model!r} does not exist; this server serves {name_list(names)}{also}",
                   status_code=404, param="model", code="model_not_found")

    @classmethod
    def unauthorized(cls) -> "OpenAIError":
        return cls("Incorrect or missing API key; send 'Authorization: Bearer <key>'", status_code=401,
                   code="invalid_api_key")

    @classmethod
    def engine_dead(cls, reason: str = "") -> "OpenAIError":
        """503 ``engine_unavailable``: the engine process died. Nothing restarts it in-process, so the message
        promises no recovery: the server must be restarted (it exits by itself unless kept alive)."""
        message = ("The engine has died; this server cannot serve requests until it is restarted"
                   + (f" ({reason})" if reason else ""))
        return cls(message, status_code=503, type="server_error", code="engine_unavailable")


def from_invalid_param(exc: InvalidParamError) -> OpenAIError:
    """An engine or SamplingParams range error as a 400 naming the field."""
    return OpenAIError.bad_param(str(exc), exc.param)


def from_validation_error(exc: ValidationError | RequestValidationError) -> OpenAIError:
    """A pydantic type error as a 400; ``param`` is the top-level field of the first error.

    FastAPI prefixes locations with "body"/"query", dropped here; a location reads as the client wrote it
    (``messages[0].role``), and a scalar input is quoted back (``messages[0].role: Input should be 'system',
    ... or 'function', got 'wizard'``). A field whose every union member refused the input is one sentence
    naming the members (``stop: must be str or list[str], got 42``), not one error per member, unless a
    member took the input's shape and refused a value, which is then the error (``prompt[0]: Input should be
    less than or equal to 9223372036854775807``).
    """
    errors = exc.errors()
    if not errors:
        return OpenAIError.bad_param("invalid request", None)
    locs = [[part for part in e.get("loc", ()) if part not in ("body", "query", "path")] for e in errors]
    first, loc = errors[0], locs[0]
    param = str(loc[0]) if loc else None
    if first.get("type") in ("json_invalid", "model_attributes_type") and not loc:
        return OpenAIError.bad_param(f"the request body is not a valid JSON object: {first.get('msg')}", None)
    got = _quoted_input(first.get("input"))
    union = _union_members(locs)
    if union:
        depth, group = union
        extra = f" (and {len(errors) - len(group)} more)" if len(errors) > len(group) else ""
        # A member that took the input's shape but not a value (an int beyond 64 bits in list[int]) says why.
        for i in group:
            if not str(errors[i].get("type", "")).endswith("_type"):
                where = locs[i][:depth] + locs[i][depth + 1:]
                return OpenAIError.bad_param(f"{_where(where)}: {errors[i].get('msg')}"
                                             f"{_quoted_input(errors[i].get('input'))}{extra}", param)
        members = list(dict.fromkeys(str(locs[i][depth]).replace("constrained-", "") for i in group))
        return OpenAIError.bad_param(f"{_where(loc[:depth])}: must be {' or '.join(members)}{got}{extra}", param)
    extra = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return OpenAIError.bad_param(f"{_where(loc)}: {first.get('msg')}{got}{extra}", param)


_BASIC_TYPES = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})


def _is_member_label(part: object) -> bool:
    return isinstance(part, str) and (part in _BASIC_TYPES or "[" in part)


def _union_members(locs: list[list[object]]) -> tuple[int, list[int]] | None:
    """For the first error: (the depth of its union member label, the indices of the errors on that field)
    when it is one of several errors on one field, each under a member label (pydantic's ``("stop", "str")``,
    ``("stop", "list[str]", 0)``); None otherwise."""
    first = locs[0]
    for depth in range(len(first) - 1, 0, -1):
        if not _is_member_label(first[depth]):
            continue
        same = [i for i, loc in enumerate(locs) if len(loc) > depth and loc[:depth] == first[:depth]]
        if len(same) >= 2 and all(_is_member_label(locs[i][depth]) for i in same):
            return depth, same
    return None


def _where(loc: list[object]) -> str:
    """A location as the client wrote it: ``messages[0].content``; "body" for the body itself."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "body"


_MAX_QUOTED_CHARS = 60


def _quoted_input(value: object) -> str:
    """``", got <value>"`` for a string, number or boolean the client sent (cut to a few dozen characters);
    "" for anything else (objects, lists, null, missing fields)."""
    if isinstance(value, bool):
        shown = "true" if value else "false"
    elif isinstance(value, (int, float, str)):
        shown = repr(value)
    else:
        return ""
    if len(shown) > _MAX_QUOTED_CHARS:
        shown = shown[:_MAX_QUOTED_CHARS] + "..."
    return f", got {shown}"


def error_json(error: OpenAIError, headers: Mapping[str, str] | None = None) -> JSONResponse:
    """``error`` as its JSON body and status; ``headers`` (e.g. a 405's ``Allow``) are sent with it."""
    return JSONResponse(status_code=error.status_code, content=error.to_response().model_dump(),
                        headers=dict(headers) if headers else None)


_STATUS_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error",
                 405: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error"}


def _status_phrase(status_code: int) -> str:
    try:
        return HTTPStatus(status_code).phrase
    except ValueError:
        return f"HTTP {status_code}"


def install_error_handlers(app: FastAPI, engine_dead_error: type[BaseException] | None = None) -> None:
    """Route every exception raised by a handler (ours or a plugin's) to an OpenAI-shaped body.

    Args:
        engine_dead_error: the engine's "core died" exception class, reported as 503.
    """

    async def on_openai_error(_: Request, exc: OpenAIError) -> JSONResponse:
        return error_json(exc)

    async def on_invalid_param(_: Request, exc: InvalidParamError) -> JSONResponse:
        return error_json(from_invalid_param(exc))

    async def on_validation(_: Request, exc: RequestValidationError | ValidationError) -> JSONResponse:
        return error_json(from_validation_error(exc))

    async def on_http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else _status_phrase(exc.status_code)
        kind = _STATUS_TYPES.get(exc.status_code, "invalid_request_error" if exc.status_code < 500
                                 else "server_error")
        # The exception's headers are part of the answer: a 405's Allow, a 401's WWW-Authenticate.
        return error_json(OpenAIError(message, status_code=exc.status_code, type=kind), exc.headers)

    async def on_engine_dead(_: Request, exc: BaseException) -> JSONResponse:
        return error_json(OpenAIError.engine_dead(str(exc)))

    async def on_bug(request: Request, exc: Exception) -> JSONResponse:
        logger.exception("internal error while serving %s %s", request.method, request.url.path)
        return error_json(OpenAIError(f"internal server error: {type(exc).__name__}: {exc}", status_code=500,
                                      type="server_error"))

    app.add_exception_handler(OpenAIError, on_openai_error)
    app.add_exception_handler(InvalidParamError, on_invalid_param)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(ValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    if engine_dead_error is not None:
        app.add_exception_handler(engine_dead_error, on_engine_dead)
    app.add_exception_handler(Exception, on_bug)
