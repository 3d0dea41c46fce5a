"""The ``POST /admin/reset_prefix_cache`` route.

It drops every cached prefix block that no running request holds (``AsyncLLM.reset_prefix_cache``), for
benchmarks that must start cold and after weight updates. When the server has an API key it requires
``Authorization: Bearer <key>`` like the ``/v1`` routes, answering 401 in the OpenAI error shape.
"""

from __future__ import annotations

import hmac
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse


def _unauthorized() -> JSONResponse:
    return JSONResponse(status_code=401, content={"error": {
        "message": "invalid or missing API key", "type": "invalid_request_error", "param": None,
        "code": "invalid_api_key"}})


def make_router(app_state: Any) -> APIRouter:
    """Build the router. ``app_state`` is the server's ``app.state`` with ``engine_client`` (AsyncLLM) and
    ``api_key`` (str or None)."""
    engine_client = app_state.engine_client
    api_key: str | None = app_state.api_key
    router = APIRouter()

    @router.post("/admin/reset_prefix_cache")
    async def reset_prefix_cache(request: Request) -> JSONResponse:
        if api_key is not None:
            given = request.headers.get("authorization", "")
            # Constant-time comparison: the key is a secret.
            if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
                return _unauthorized()
        reset = await engine_client.reset_prefix_cache()
        return JSONResponse({"reset": bool(reset)})

    return router
