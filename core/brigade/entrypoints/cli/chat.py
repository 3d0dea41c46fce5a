"""``brigade chat``: an interactive chat against a running Brigade (or any OpenAI-compatible) server."""

from __future__ import annotations

import argparse
import logging
import sys
from urllib.parse import urlunparse

from brigade import envs
from brigade.entrypoints.cli.arg_types import http_url, positive_int

_EPILOG = """\
errors: an error from the server (an unknown --model, a bad key, a conversation grown past the model's
context...) is one line with the server's message. In a chat typed at a terminal, a request the server
refuses as bad (HTTP 400, e.g. the conversation no longer fits the context) drops that message and the chat
goes on, so you can send something shorter; a line that is not valid UTF-8 is dropped the same way. Any other
error, and any error with input from a pipe or a file, ends the chat with exit status 1."""


def server_url(text: str) -> str:
    """argparse type: the server's /v1 base URL. The server's address alone (``http://HOST:PORT``) gets ``/v1``
    added, as ``brigade bench serve --base-url`` takes either form; another path (a proxy's) is kept."""
    url = http_url(text, "give http(s)://HOST:PORT or its /v1 base URL, e.g. http://127.0.0.1:8000/v1")
    return urlunparse((url.scheme, url.netloc, url.path.rstrip("/") or "/v1", "", url.query, ""))


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("chat", help="chat interactively with a running server",
                                   description="Chat with a running OpenAI-compatible server; an empty line "
                                               "or end of input quits.",
                                   epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
                                   allow_abbrev=False)
    parser.add_argument("--url", type=server_url, default="http://127.0.0.1:8000/v1",
                        help="the server's address or /v1 base URL; /v1 is added to an address without a path "
                             "(default %(default)s)")
    parser.add_argument("--model", default=None,
                        help="model name (default: the server's first model; ./scripts/serve.sh serves the set-up's "
                             "SmolLM2-135M-Instruct)")
    parser.add_argument("--api-key", default=envs.BRIGADE_API_KEY or "EMPTY",
                        help="Bearer key for /v1 (default: $BRIGADE_API_KEY)")
    parser.add_argument("--system-prompt", default=None, help="a system message opening the conversation")
    parser.add_argument("--max-tokens", type=positive_int, default=256,
                        help="tokens per answer at most, a positive integer (default %(default)s)")
    parser.set_defaults(run=run)
    return parser


def _error_line(exc: Exception, url: str) -> str:
    """One line for an openai error: the server's own message (and its HTTP status), or why it is unreachable."""
    import openai

    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__ or exc.__context__
        return f"cannot reach {url} ({cause or exc.message})"
    if isinstance(exc, openai.APIStatusError):
        body = exc.body
        message = body.get("message") if isinstance(body, dict) else None
        if not isinstance(message, str) or not message:
            message = body if isinstance(body, str) and body.strip() else exc.response.reason_phrase
        return f"{' '.join(str(message).split())} (HTTP {exc.status_code})"
    return " ".join(str(getattr(exc, "message", None) or exc).split())  # an error event inside the stream


def run(args: argparse.Namespace) -> int:
    try:
        import openai
    except ImportError:
        print("brigade chat needs the openai package: pip install openai", file=sys.stderr)
        return 1
    for name in ("httpx", "httpx2", "openai"):  # INFO lines per request and retry otherwise, amid the conversation
        logging.getLogger(name).setLevel(logging.WARNING)
    client = openai.OpenAI(base_url=args.url, api_key=args.api_key)
    try:
        model = args.model or client.models.list().data[0].id
    except openai.APIStatusError as exc:
        hint = ("give the server's key with --api-key KEY (or $BRIGADE_API_KEY)" if exc.status_code == 401 else
                "is --url the server's address (http://HOST:PORT) or its /v1 base URL?")
        print(f"brigade chat: error: GET {args.url}/models answered {_error_line(exc, args.url)}; {hint}",
              file=sys.stderr)
        return 1
    except (openai.APIError, IndexError) as exc:
        what = _error_line(exc, args.url) if isinstance(exc, openai.APIError) else "the server lists no model"
        print(f"brigade chat: error: {what}", file=sys.stderr)
        return 1
    interactive = sys.stdin.isatty()
    if interactive and not args.model:  # say which model answers; piped input keeps stderr for errors only
        print(f"chatting with {model} (the server's first model) at {args.url}; an empty line quits",
              file=sys.stderr, flush=True)
    messages = [{"role": "system", "content": args.system_prompt}] if args.system_prompt else []
    while True:
        try:
            line = input("> ")
            line.encode("utf-8")  # stdin decoded with surrogateescape keeps bad bytes as lone surrogates
        except EOFError:
            print()  # the prompt line ends (input piped or Ctrl-D)
            return 0
        except UnicodeError:  # a UnicodeDecodeError (strict stdin) or the UnicodeEncodeError above
            print(flush=True)
            print("brigade chat: error: the input line is not valid UTF-8; type or pipe UTF-8 text", file=sys.stderr,
                  flush=True)
            if not interactive:
                return 1
            continue  # at a terminal, as for a refused message: the chat goes on without the line
        if not line.strip():
            return 0
        messages.append({"role": "user", "content": line})
        reply = []
        try:
            for chunk in client.chat.completions.create(model=model, messages=messages, stream=True,
                                                        max_tokens=args.max_tokens):
                if chunk.choices and chunk.choices[0].delta.content:
                    reply.append(chunk.choices[0].delta.content)
                    print(chunk.choices[0].delta.content, end="", flush=True)
        except openai.APIError as exc:
            if reply:
                print(flush=True)
            print(f"brigade chat: error: {_error_line(exc, args.url)}", file=sys.stderr, flush=True)
            if not (interactive and isinstance(exc, openai.BadRequestError)):
                return 1
            messages.pop()  # the refused message; the conversation goes on without it
            continue
        print()
        messages.append({"role": "assistant", "content": "".join(reply)})
