"""``brigade generate "PROMPT"``: one offline generation with the LLM class, printed to stdout."""

from __future__ import annotations

import argparse
import json
import sys


def add_parser(subparsers, plugin_choices: dict[str, list[str]]) -> argparse.ArgumentParser:
    from brigade.entrypoints.cli.arg_types import positive_int
    from brigade.entrypoints.cli.engine_args import add_engine_args

    parser = subparsers.add_parser("generate", help="generate text for one prompt, offline", allow_abbrev=False,
                                   description="Generate text for one prompt, offline, and print it.")
    parser.add_argument("prompt", help="the prompt text")
    parser.add_argument("--chat", action="store_true", help="wrap the prompt as a user message in the chat template")
    parser.add_argument("--max-tokens", type=positive_int, default=64,
                        help="tokens to generate at most, a positive integer (default %(default)s)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default %(default)s)")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus mass kept, in (0, 1] (default %(default)s)")
    parser.add_argument("--top-k", type=int, default=0,
                        help="most likely tokens kept; 0 keeps all (default %(default)s)")
    parser.add_argument("--sample-seed", type=int, default=None, help="seed of this request's sampler")
    parser.add_argument("--stop", action="append", default=[], help="a stop string (repeatable)")
    parser.add_argument("--json", action="store_true", help="print the output as JSON with token ids")
    add_engine_args(parser, plugin_choices)
    parser.set_defaults(run=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from brigade.entrypoints.cli.engine_args import runnable_config_from_args
    from brigade.entrypoints.cli.start_engine import start_llm
    from brigade.sampling_params import InvalidParamError, SamplingParams

    from brigade.config import ConfigError

    if args.skip_tokenizer_init:  # before the model loads: a text prompt needs the tokenizer
        raise ConfigError("--skip-tokenizer-init: generate takes a text prompt, which needs the tokenizer; drop the "
                          "flag (token-id prompts go through brigade serve --skip-tokenizer-init or LLM.generate)")
    config = runnable_config_from_args(args)  # ConfigError: one line from the CLI's main, before the model loads
    try:
        params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                                top_k=args.top_k, seed=args.sample_seed, stop=args.stop)
    except InvalidParamError as exc:
        print(f"brigade generate: error: --{(exc.param or '').replace('_', '-')}: {exc}", file=sys.stderr)
        return 2
    llm = start_llm(config)
    try:
        if args.chat:
            output = llm.chat([{"role": "user", "content": args.prompt}], params, use_tqdm=False)[0]
        else:
            output = llm.generate(args.prompt, params, use_tqdm=False)[0]
    except InvalidParamError as exc:
        print(f"brigade generate: error: {exc}", file=sys.stderr)
        return 2
    completion = output.outputs[0]
    if args.json:
        print(json.dumps({"prompt": args.prompt, "text": completion.text, "token_ids": completion.token_ids,
                          "finish_reason": completion.finish_reason}))
    else:
        print(completion.text)
    return 0
