"""HTTP around the routes: a wrong method is a 405 keeping its Allow header, CORS preflights and headers (and the
flags that limit origins, methods and credentials), and /health's GET and HEAD with distinct OpenAPI operation
ids."""

from __future__ import annotations

import httpx
from remote_server import RemoteServer


def test_wrong_method_is_a_405_with_allow(server):
    response = httpx.get(server.url("/v1/completions"), timeout=30)
    assert response.status_code == 405
    assert "POST" in response.headers.get("allow", ""), response.headers
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == 405


def test_cors_preflight_is_answered(server):
    response = httpx.options(server.url("/v1/chat/completions"), timeout=30,
                             headers={"Origin": "http://example.com", "Access-Control-Request-Method": "POST",
                                      "Access-Control-Request-Headers": "content-type,authorization"})
    assert response.status_code == 200, response.text
    assert response.headers.get("access-control-allow-origin") in ("*", "http://example.com")
    assert "POST" in response.headers.get("access-control-allow-methods", "")


def test_cors_header_on_a_plain_request(server):
    response = httpx.get(server.url("/v1/models"), headers={"Origin": "http://example.com"}, timeout=30)
    assert response.status_code == 200
    assert response.headers.get("access-control-allow-origin") == "*"


def test_cors_flags_limit_the_origins(smollm2_path):
    srv = RemoteServer(smollm2_path, ["--max-model-len", "128", "--num-gpu-blocks-override", "32",
                                      "--allowed-origins", '["https://app.example"]',
                                      "--allowed-methods", '["POST"]', "--allow-credentials"])
    try:
        ask = {"Access-Control-Request-Method": "POST"}
        allowed = httpx.options(srv.url("/v1/completions"), headers={"Origin": "https://app.example", **ask},
                                timeout=30)
        assert allowed.status_code == 200, allowed.text
        assert allowed.headers["access-control-allow-origin"] == "https://app.example"
        assert allowed.headers["access-control-allow-credentials"] == "true"
        refused = httpx.options(srv.url("/v1/completions"), headers={"Origin": "https://evil.example", **ask},
                                timeout=30)
        assert refused.status_code == 400 and "access-control-allow-origin" not in refused.headers
    finally:
        srv.stop()


def test_health_get_and_head_have_distinct_operation_ids(http, server):
    schema = http.get("/openapi.json")
    assert schema.status_code == 200
    health = schema.json()["paths"]["/health"]
    assert set(health) == {"get", "head"}
    assert health["get"]["operationId"] != health["head"]["operationId"]
    assert http.head("/health").status_code == 200 and http.get("/health").status_code == 200
    assert "Duplicate Operation ID" not in server.log_tail(200_000)
