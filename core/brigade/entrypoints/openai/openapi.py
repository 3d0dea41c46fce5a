"""The request-body schemas of /openapi.json for routes that parse their own JSON bodies.

The OpenAI routes read the raw body themselves (so malformed JSON and bad types are 400s naming the
field, never FastAPI's 422); FastAPI therefore cannot see their bodies. This module puts the pydantic
models' JSON schemas back into the OpenAPI document, so clients, code generators and API fuzzers
(tests/entrypoints/openai/test_robustness.py runs schemathesis on it) see what each route accepts.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

__all__ = ["json_body", "install_request_schemas"]

_REF = "#/components/schemas/{model}"


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` for a route whose JSON body is ``model`` (pass it to ``@app.post``)."""
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": _REF.format(model=model.__name__)}}}}}


def install_request_schemas(app: FastAPI, models: list[type[BaseModel]]) -> None:
    """Make ``app.openapi()`` include the JSON schemas of ``models`` (and what they reference)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            _, defs = models_json_schema([(m, "validation") for m in models], ref_template=_REF)
            schema.setdefault("components", {}).setdefault("schemas", {}).update(defs.get("$defs", {}))
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi
