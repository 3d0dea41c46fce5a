"""``brigade serve --speculative-config``: a real server with n-gram speculative decoding, driven with the
official ``openai`` client, gives the same greedy text as transformers (hence as without speculation),
streaming included, and exports vLLM's spec_decode counters; bad values are one CLI line."""

from __future__ import annotations

import argparse
import json

import httpx
import pytest
from cli_runner import run_main
from remote_server import RemoteServer

from brigade.config import ConfigError
from brigade.entrypoints.cli import serve
from brigade.entrypoints.cli.engine_args import config_from_args

SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1}
NAME = "smollm2"
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3,"
REPEAT = [{"role": "user", "content": "Repeat this list exactly: apple, banana, cherry, date, elderberry, fig."}]


@pytest.fixture(scope="module")
def server(smollm2_path):
    srv = RemoteServer(smollm2_path, ["--served-model-name", NAME, "--max-model-len", "512", "--block-size", "16",
                                      "--num-gpu-blocks-override", "128", "--speculative-config", json.dumps(SPEC)])
    yield srv
    srv.stop()


def greedy_text(hf_reference, token_ids: list[int], max_tokens: int) -> str:
    ids = hf_reference.greedy([token_ids], max_tokens)[0]
    return hf_reference.tokenizer.decode(ids, skip_special_tokens=True)


def test_completion_and_streaming_chat_equal_greedy_text(server, hf_reference):
    client = server.openai_client()
    tok = hf_reference.tokenizer
    out = client.completions.create(model=NAME, prompt=COUNTING, max_tokens=24, temperature=0)
    assert out.choices[0].text == greedy_text(hf_reference, tok.encode(COUNTING), 24)
    assert out.usage.completion_tokens == 24

    stream = client.chat.completions.create(model=NAME, messages=REPEAT, max_tokens=32, temperature=0, stream=True)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    prompt_ids = tok.encode(tok.apply_chat_template(REPEAT, tokenize=False, add_generation_prompt=True),
                            add_special_tokens=False)
    assert text == greedy_text(hf_reference, prompt_ids, 32)

    metrics = {}
    for line in httpx.get(server.url("/metrics"), timeout=30).text.splitlines():
        if line.startswith("brigade:spec_decode"):
            name, value = line.rsplit(" ", 1)
            metrics[name.replace(f'model_name="{NAME}"', "").replace("{,", "{").replace(",}", "}")] = float(value)
    assert metrics["brigade:spec_decode_num_drafts_total{}"] > 0
    drafted = metrics["brigade:spec_decode_num_draft_tokens_total{}"]
    accepted = metrics["brigade:spec_decode_num_accepted_tokens_total{}"]
    assert 0 < accepted <= drafted
    per_pos = [metrics[f'brigade:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}}'] for i in range(4)]
    assert sum(per_pos) == accepted and per_pos == sorted(per_pos, reverse=True)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="brigade")
    serve.add_parser(parser.add_subparsers(dest="command"), {})
    return parser.parse_args(["serve", *argv])


@pytest.mark.parametrize("value,expected", [
    ('{"method": "eagle", "num_speculative_tokens": 2}',
     "--speculative-config method 'eagle' is not supported; supported: ngram"),
    ('{"method": "ngram", "num_speculative_tokens": 0}', "--speculative-config num_speculative_tokens must be "
                                                         "from 1 to 64, got 0"),
    ('{"method": "ngram"', "--speculative-config is not valid JSON"),
    ('{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 4, "prompt_lookup_max": 2}',
     "--speculative-config prompt_lookup_min 4 is above prompt_lookup_max 2"),
    ('{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 0}',
     "--speculative-config prompt_lookup_max must be at least 1, got 0"),
    ('{"method": "ngram", "num_speculative_tokens": "3"}', "num_speculative_tokens must be a whole number, got '3'"),
    ('{"method": "ngram", "num_speculative_tokens": 3, "model": "x"}',
     "--speculative-config has unknown keys ['model']; allowed: method, num_speculative_tokens"),
    ('[4]', "--speculative-config must be a JSON object"),
    ('{"num_speculative_tokens": 3}', '--speculative-config needs "method"; supported: ngram'),
])
def test_bad_values_are_one_line_config_errors(smollm2_path, value, expected):
    with pytest.raises(ConfigError) as info:
        config_from_args(parse(str(smollm2_path), "--speculative-config", value))
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_defaults_follow_vllm(smollm2_path):
    config = config_from_args(parse(str(smollm2_path), "--speculative-config",
                                    '{"method": "ngram", "num_speculative_tokens": 3}'))
    spec = config.speculative_config
    assert (spec.num_speculative_tokens, spec.prompt_lookup_min, spec.prompt_lookup_max) == (3, 5, 5)
    only_max = config_from_args(parse(str(smollm2_path), "--speculative-config",
                                      '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}'))
    assert only_max.speculative_config.prompt_lookup_min == 4


def test_the_cli_prints_one_line(smollm2_path):
    proc = run_main("serve", str(smollm2_path), "--speculative-config",
                    '{"method": "medusa", "num_speculative_tokens": 2}')
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith("brigade serve: error: --speculative-config method 'medusa' is not supported")
