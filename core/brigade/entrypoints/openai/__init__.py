"""The OpenAI-compatible HTTP server (docs/server.md): ``build_app`` over an AsyncLLM, and ``serve_http`` to run it.

Import ``brigade.entrypoints.openai.api_server`` for them; this package imports nothing on its own so that
``import brigade`` stays cheap.
"""
