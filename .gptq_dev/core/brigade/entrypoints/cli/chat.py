"""``brigade chat``: an interactive chat against a running Brigade (or any OpenAI-compatible) server."""

from __future__ import annotations

import argparse
import os
import sys


def add_parser(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("chat", help="chat interactively with a running server",
                                   description="Chat with a running OpenAI-compatible server; an empty line "
                                               "or end of input quits.")
    parser.add_argument("--url", default="http://127.0.0.1:8000/v1", help="the server's /v1 base URL")
    parser.add_argument("--model", default=None, help="model name (default: the server's first model)")
    parser.add_argument("--api-key", default=os.environ.get("BRIGADE_API_KEY", "EMPTY"),
                        help="Bearer key for /v1 (default: $BRIGADE_API_KEY)")
    parser.add_argument("--system-prompt", default=None, help="a system message opening the conversation")
    parser.add_argument("--max-tokens", type=int, default=256, help="tokens per answer at most (default %(default)s)")
    parser.set_defaults(run=run)
    return parser


def run(args: argparse.Namespace) -> int:
    try:
        import openai
    except ImportError:
        print("brigade chat needs the openai package: pip install openai", file=sys.stderr)
        return 1
    client = openai.OpenAI(base_url=args.url, api_key=args.api_key)
    try:
        model = args.model or client.models.list().data[0].id
    except openai.APIError as exc:
        print(f"brigade chat: cannot reach {args.url}: {exc}", file=sys.stderr)
        return 1
    messages = [{"role": "system", "content": args.system_prompt}] if args.system_prompt else []
    while True:
        try:
            line = input("> ")
        except EOFError:
            return 0
        if not line.strip():
            return 0
        messages.append({"role": "user", "content": line})
        reply = []
        for chunk in client.chat.completions.create(model=model, messages=messages, stream=True,
                                                    max_tokens=args.max_tokens):
            if chunk.choices and chunk.choices[0].delta.content:
                reply.append(chunk.choices[0].delta.content)
                print(chunk.choices[0].delta.content, end="", flush=True)
        print()
        messages.append({"role": "assistant", "content": "".join(reply)})
