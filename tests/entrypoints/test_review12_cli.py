"""A fresh user's review of the command line (review 12): ``brigade chat``'s errors and URL, KV blocks below the
minimum, vLLM's launch flags, abbreviated flags, ``bench`` lengths and ``--host``/``--port``, and the serve script.
Real subprocesses and a real server on loopback; no mocks."""

from __future__ import annotations

import argparse
import os
import pty
import subprocess
import time
from pathlib import Path

import pytest
from remote_server import RemoteServer, brigade_command, find_free_port

MODEL_NAME = "smol"
MAX_MODEL_LEN = 128


def run_cli(*argv: str, stdin: str | None = None, env: dict[str, str] | None = None,
            timeout: float = 180) -> subprocess.CompletedProcess:
    """``brigade ARGV`` at the default log level (no BRIGADE_LOGGING_LEVEL), as a user runs it."""
    base = {k: v for k, v in os.environ.items() if k != "BRIGADE_LOGGING_LEVEL"}
    return subprocess.run([*brigade_command(), *argv], capture_output=True, text=True, timeout=timeout,
                          input=stdin if stdin is not None else "", env={**base, **(env or {})})


def assert_one_line(proc: subprocess.CompletedProcess, prefix: str, needle: str, *, status: int = 2) -> str:
    lines = proc.stderr.splitlines()
    assert proc.returncode == status, proc.stderr[-3000:]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith(prefix + ": error: ") and needle in lines[0], lines[0]
    assert "Traceback" not in proc.stderr and "usage:" not in proc.stderr
    return lines[0]


@pytest.fixture(scope="module")
def server(smollm2_path):
    """The defaults of vLLM's logging flags: no request lines, the stats line (every second here)."""
    srv = RemoteServer(smollm2_path, ["--served-model-name", MODEL_NAME, "--max-model-len", str(MAX_MODEL_LEN),
                                      "--max-num-seqs", "4"], env={"BRIGADE_LOG_STATS_INTERVAL": "1"})
    yield srv
    srv.stop()


# ---- 1: brigade chat ---------------------------------------------------------------------------------------

def test_chat_unknown_model_is_one_line_with_the_servers_message(server):
    proc = run_cli("chat", "--url", server.url("/v1"), "--model", "nope", stdin="hi\n")
    assert_one_line(proc, "brigade chat", f"The model 'nope' does not exist; this server serves '{MODEL_NAME}' "
                                          "(HTTP 404)", status=1)


def test_chat_max_tokens_is_checked_while_parsing():
    for value, needle in (("-10", "argument --max-tokens: must be at least 1, got -10"),
                          ("0", "argument --max-tokens: must be at least 1, got 0"),
                          ("many", "argument --max-tokens: expected a whole number of at least 1, got 'many'")):
        assert_one_line(run_cli("chat", "--max-tokens", value, stdin="hi\n"), "brigade chat", needle)


def test_chat_takes_the_servers_address_with_or_without_v1(server):
    for url in (server.base_url, server.base_url + "/", server.url("/v1"), server.url("/v1/")):
        proc = run_cli("chat", "--url", url, "--max-tokens", "4", stdin="Say hello.\n")
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stdout.startswith("> ") and len(proc.stdout.strip()) > 2, proc.stdout
        assert proc.stderr == "", proc.stderr[-3000:]  # no log lines amid the conversation
    assert_one_line(run_cli("chat", "--url", "127.0.0.1:8000"), "brigade chat",
                    "argument --url: '127.0.0.1:8000' is not an http(s) URL; give http(s)://HOST:PORT or its /v1")


def test_chat_context_overflow_from_a_pipe_is_one_line_and_status_1(server):
    proc = run_cli("chat", "--url", server.base_url, "--max-tokens", "4", stdin="word " * 400 + "\n")
    line = assert_one_line(proc, "brigade chat", "(HTTP 400)", status=1)
    assert str(MAX_MODEL_LEN) in line, line


def test_chat_unreachable_server_is_one_line():
    url = f"http://127.0.0.1:{find_free_port()}"
    for argv in ((), ("--model", "x")):  # found listing the models, or at the first message
        proc = run_cli("chat", "--url", url, *argv, stdin="hi\n")
        assert_one_line(proc, "brigade chat", f"cannot reach {url}/v1", status=1)


def test_interactive_chat_goes_on_after_a_refused_message(server):
    """At a terminal, a 400 (here the context overflowing) drops that message: the next one is answered."""
    controller, terminal = pty.openpty()
    try:
        proc = subprocess.Popen([*brigade_command(), "chat", "--url", server.base_url, "--max-tokens", "4"],
                                stdin=terminal, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        os.write(controller, ("word " * 400 + "\nSay hello.\n\n").encode())
        out, err = proc.communicate(timeout=180)
    finally:
        os.close(controller)
        os.close(terminal)
    assert proc.returncode == 0, err[-3000:]
    assert "Traceback" not in err and len(err.splitlines()) == 1, err[-3000:]
    assert err.startswith("brigade chat: error: ") and "(HTTP 400)" in err
    assert out.count("> ") == 3 and len(out.replace("> ", "").strip()) > 0, out  # the second message's answer


# ---- 2: --num-gpu-blocks-override below one usable block ---------------------------------------------------

@pytest.mark.parametrize("blocks", ["1", "0", "-3"])
def test_too_few_kv_blocks_are_refused_up_front(smollm2_path, blocks):
    """Block 0 is the pool's null block (never holds tokens), so the least that can serve is 2 blocks."""
    proc = run_cli("serve", str(smollm2_path), "--num-gpu-blocks-override", blocks, "--host", "127.0.0.1",
                   "--port", str(find_free_port()))
    line = assert_one_line(proc, "brigade serve", f"--num-gpu-blocks-override must be at least 2, got {blocks}")
    assert "null block" in line and "tensors from" not in proc.stderr
    from brigade.config import ConfigError
    from brigade.entrypoints.llm import LLM

    with pytest.raises(ConfigError, match="num-gpu-blocks-override must be at least 2"):
        LLM(str(smollm2_path), num_gpu_blocks_override=int(blocks))


def test_a_kv_cache_too_small_for_max_model_len_is_refused_before_the_model_loads(smollm2_path):
    """With --num-gpu-blocks-override the capacity is known before any weight loads: serve's check says so."""
    proc = run_cli("serve", str(smollm2_path), "--num-gpu-blocks-override", "2", "--block-size", "16",
                   "--host", "127.0.0.1", "--port", str(find_free_port()))
    line = assert_one_line(proc, "brigade serve", "the KV cache holds 16 tokens (1 usable block of 16)")
    assert line.endswith("or set --max-model-len 16 or less") and "tensors from" not in proc.stderr


@pytest.mark.parametrize("num_blocks", [0, 1])
def test_the_capacity_hint_never_offers_a_max_model_len_below_1(num_blocks):
    """A pool sized from --kv-cache-memory can still come out below 2 blocks: no '--max-model-len 0 or less'."""
    from brigade.config import ConfigError
    from brigade.engine.core import check_kv_capacity

    with pytest.raises(ConfigError) as info:
        check_kv_capacity(num_blocks, 16, 2048)
    message = str(info.value)
    assert "no usable block" in message and "--max-model-len" not in message, message
    assert "at least 2 blocks" in message, message


# ---- 3: vLLM's launch flags --------------------------------------------------------------------------------

def parse(*argv: str) -> argparse.Namespace:
    from brigade.entrypoints.cli.main import build_parser

    return build_parser({}).parse_args(list(argv))


@pytest.mark.parametrize("alias,dtype", [("half", "float16"), ("float", "float32"), ("float16", "float16")])
def test_dtype_half_and_float_are_vllms_names(smollm2_path, alias, dtype):
    from brigade.entrypoints.cli.engine_args import config_from_args

    assert config_from_args(parse("serve", str(smollm2_path), "--dtype", alias)).model_config.dtype == dtype


def test_dtype_float_generates_and_a_bad_dtype_names_the_aliases(smollm2_path):
    proc = run_cli("generate", "The capital of France is", "--model", str(smollm2_path), "--dtype", "float",
                   "--max-tokens", "3", "--max-model-len", "64")
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr[-3000:]
    assert_one_line(run_cli("serve", str(smollm2_path), "--dtype", "double"), "brigade serve",
                    "--dtype 'double' is not known; use one of auto, bfloat16, float16, float32 (or half for float16, "
                    "float for float32)")


@pytest.fixture
def remote_code_model(smollm2_path, tmp_path):
    """SmolLM2 whose config.json names its own config class (auto_map), as models with custom code do."""
    import json

    folder = tmp_path / "remote-code-model"
    folder.mkdir()
    for item in Path(smollm2_path).iterdir():
        if item.name != "config.json":
            (folder / item.name).symlink_to(item)
    config = json.loads((Path(smollm2_path) / "config.json").read_text())
    config.update(model_type="review12_llama", auto_map={"AutoConfig": "configuration_review12.Review12Config"})
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "configuration_review12.py").write_text(
        "from transformers import LlamaConfig\n\n\nclass Review12Config(LlamaConfig):\n"
        "    model_type = \"review12_llama\"\n")
    return folder


def test_trust_remote_code_runs_the_models_config_code(remote_code_model, tmp_path):
    env = {"HF_HOME": str(tmp_path / "hf-home")}  # where transformers copies the folder's code
    refused = run_cli("serve", str(remote_code_model), env=env)
    assert_one_line(refused, "brigade serve", "has its own config code (auto_map in config.json), which runs only "
                                              "with --trust-remote-code")
    proc = run_cli("generate", "The capital of France is", "--model", str(remote_code_model), "--trust-remote-code",
                   "--max-tokens", "3", "--max-model-len", "64", env=env)
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr[-3000:]
    config = parse("serve", str(remote_code_model), "--trust-remote-code")
    from brigade.entrypoints.cli.engine_args import config_from_args

    assert config_from_args(config).model_config.trust_remote_code
    assert not config_from_args(parse("serve", str(remote_code_model))).model_config.trust_remote_code


def _complete(server, prompt: str = "Hello") -> None:
    import httpx

    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 4}
    assert httpx.post(server.url("/v1/completions"), json=body, timeout=120).status_code == 200


def _wait_for(server, needle: str, timeout_s: float = 30.0) -> str:
    deadline = time.monotonic() + timeout_s
    while needle not in (log := server.log_tail(10**7)):
        assert time.monotonic() < deadline, log[-3000:]
        time.sleep(0.2)
    return log


def test_by_default_requests_are_not_logged_and_stats_are(server):
    _complete(server)
    log = _wait_for(server, "Avg prompt throughput: ")
    assert "Avg generation throughput: " in log and "KV cache usage: " in log and "Prefix cache hit rate: " in log
    assert "prompt tokens, params=" not in log


def test_enable_log_requests_disable_log_stats_and_the_tool_flags(smollm2_path):
    import httpx

    srv = RemoteServer(smollm2_path, ["--served-model-name", MODEL_NAME, "--max-model-len", "512",
                                      "--enable-log-requests", "--disable-log-stats", "--enable-auto-tool-choice",
                                      "--tool-call-parser", "hermes", "--disable-fastapi-docs"],
                       env={"BRIGADE_LOG_STATS_INTERVAL": "0.5"})
    try:
        for path in ("/docs", "/redoc", "/openapi.json"):  # item 6: vLLM's --disable-fastapi-docs
            assert httpx.get(srv.url(path), timeout=30).status_code == 404, path
        _complete(srv)
        tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
        body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Weather in Paris?"}],
                "tools": [tool], "tool_choice": "auto", "max_tokens": 24}
        assert httpx.post(srv.url("/v1/chat/completions"), json=body, timeout=120).status_code == 200
        log = _wait_for(srv, "prompt tokens, params=SamplingParams(")
        time.sleep(1.5)  # three stats intervals
        assert "Avg prompt throughput" not in srv.log_tail(10**7)
    finally:
        srv.stop()


@pytest.mark.parametrize("argv,needle", [
    (["--tool-call-parser", "llama3_json"], "--tool-call-parser 'llama3_json' is not implemented; Brigade parses tool "
                                            "calls in one format, always on: use --tool-call-parser hermes"),
    (["--enable-log-requests", "--disable-log-requests"], "--enable-log-requests and --disable-log-requests "
                                                          "contradict each other"),
])
def test_bad_logging_and_tool_flags_are_one_line(smollm2_path, argv, needle):
    assert_one_line(run_cli("serve", str(smollm2_path), *argv), "brigade serve", needle)


def test_bad_stats_interval_is_one_line(smollm2_path):
    proc = run_cli("serve", str(smollm2_path), env={"BRIGADE_LOG_STATS_INTERVAL": "soon"})
    assert_one_line(proc, "brigade serve", "BRIGADE_LOG_STATS_INTERVAL='soon' is not a positive number of seconds")


def test_log_requests_flags_map_onto_the_settings(smollm2_path):
    from brigade.entrypoints.cli.serve import settings_from_args

    assert not settings_from_args(parse("serve", str(smollm2_path))).log_requests
    assert not settings_from_args(parse("serve", str(smollm2_path), "--disable-log-requests")).log_requests
    assert settings_from_args(parse("serve", str(smollm2_path), "--enable-log-requests")).log_requests
    assert not settings_from_args(parse("serve", str(smollm2_path), "--disable-log-stats")).log_stats
    help_text = run_cli("serve", "--help").stdout
    assert "--disable-log-requests" in help_text and "deprecated" in help_text and "hermes" in help_text


def test_the_stats_line_is_info_while_tokens_flow_then_debug(caplog):
    from brigade.interfaces import IterationStats, SchedulerStats
    from brigade.metrics.log_stats import LoggingStatLogger

    now = [100.0]
    stats = LoggingStatLogger(clock=lambda: now[0])
    stats.record(SchedulerStats(num_running_reqs=2, num_waiting_reqs=1, kv_cache_usage=0.25, prefix_cache_queries=40,
                                prefix_cache_hits=10), IterationStats(num_prompt_tokens=40, num_generation_tokens=2))
    stats.record(None, IterationStats(num_generation_tokens=8))
    caplog.set_level("DEBUG", logger="brigade.metrics")
    for _ in range(3):  # traffic, the first idle interval, then idle
        now[0] += 10.0
        stats.log()
    assert [r.levelname for r in caplog.records] == ["INFO", "INFO", "DEBUG"]
    assert caplog.records[0].getMessage() == (
        "Avg prompt throughput: 4.0 tokens/s, Avg generation throughput: 1.0 tokens/s, Running: 2 reqs, Waiting: 1 "
        "reqs, KV cache usage: 25.0%, Prefix cache hit rate: 25.0%")


# ---- 4: no abbreviated flags -------------------------------------------------------------------------------

def _all_parsers(parser: argparse.ArgumentParser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _all_parsers(sub)


def test_no_brigade_parser_takes_abbreviations():
    from brigade.entrypoints.cli.main import build_parser

    parsers = list(_all_parsers(build_parser({})))
    assert len(parsers) == 9  # brigade, serve, generate, chat, bench and its three, plugins
    assert [p.prog for p in parsers if p.allow_abbrev] == []


@pytest.mark.parametrize("argv,prefix,needle", [
    (["serve", "{model}", "--enable-prefix-cachin"], "brigade serve",
     "unrecognized arguments: --enable-prefix-cachin (did you mean --enable-prefix-caching?)"),
    (["serve", "{model}", "--max-model-le", "64"], "brigade serve",
     "unrecognized arguments: --max-model-le 64 (did you mean --max-model-len?)"),
    (["serve", "{model}", "--max_model_le=64"], "brigade serve",
     "unrecognized arguments: --max-model-le=64 (did you mean --max-model-len?)"),
    (["chat", "--max-tok", "5"], "brigade chat", "unrecognized arguments: --max-tok 5 (did you mean --max-tokens?)"),
    (["bench", "latency", "{model}", "--num-iter", "3"], "brigade bench latency",
     "unrecognized arguments: --num-iter 3 (did you mean --num-iters or --num-iters-warmup?)"),
    (["serve", "{model}", "--no-such-flag"], "brigade serve", "unrecognized arguments: --no-such-flag"),
    (["serve", "{model}", "--max-model-le", "64", "--enable-prefix-cachin"], "brigade serve",
     "(did you mean --max-model-len for --max-model-le, --enable-prefix-caching for --enable-prefix-cachin?)"),
])
def test_a_prefix_of_a_flag_is_an_error_naming_it(smollm2_path, argv, prefix, needle):
    proc = run_cli(*[a.format(model=smollm2_path) for a in argv])
    line = assert_one_line(proc, prefix, needle)
    if "no-such-flag" in needle:
        assert "did you mean" not in line, line


def test_short_and_negated_flags_still_parse(smollm2_path):
    args = parse("serve", str(smollm2_path), "-O0", "-tp", "1", "-q", "fp8", "--no-enable-prefix-caching",
                 "-cc", '{"cudagraph_mode": "NONE"}')
    assert (args.optimization_level, args.tensor_parallel_size, args.quantization) == (0, 1, "fp8")
    assert args.enable_prefix_caching is False and args.compilation_config == '{"cudagraph_mode": "NONE"}'


# ---- 5: bench lengths before the engine loads; bench serve --host/--port -----------------------------------

@pytest.mark.parametrize("argv,limit", [
    (["latency", "--input-len", "100000"], "8192 (the model's max_position_embeddings)"),
    (["latency", "--input-len", "60", "--output-len", "8", "--max-model-len", "64"], "64 (--max-model-len)"),
    (["throughput", "--input-len", "100000", "--num-prompts", "2"], "8192 (the model's max_position_embeddings)"),
])
def test_bench_lengths_are_checked_before_the_engine_loads(smollm2_path, argv, limit):
    command, *flags = argv
    proc = run_cli("bench", command, str(smollm2_path), *flags)
    line = assert_one_line(proc, f"brigade bench {command}", "exceeds the max model length " + limit)
    assert "keep their sum at most" in line and "tensors from" not in proc.stderr
    assert "KV cache" not in proc.stderr and "iteration" not in proc.stdout


def test_bench_serve_host_and_port_build_the_base_url(smollm2_path, server):
    """vLLM's bench serve --host/--port: the server measured is http://HOST:PORT unless --base-url is given."""
    from urllib.parse import urlparse

    port = str(urlparse(server.base_url).port)
    out = Path(server.log.name).with_suffix(".bench.json")
    proc = run_cli("bench", "serve", str(smollm2_path), "--host", "127.0.0.1", "--port", port, "--num-prompts", "2",
                   "--input-len", "8", "--output-len", "4", "--served-model-name", MODEL_NAME, "--output-json",
                   str(out))
    try:
        assert proc.returncode == 0, proc.stderr[-3000:]
        import json

        record = json.loads(out.read_text())
        assert record["config"]["benchmark"]["base_url"] == server.base_url, record["config"]
    finally:
        out.unlink(missing_ok=True)
    assert parse("bench", "serve", "--port", "9001").port == 9001
    assert_one_line(run_cli("bench", "serve", str(smollm2_path), "--port", "70000"), "brigade bench serve",
                    "argument --port: must be in 1..65535, got 70000")
    assert_one_line(run_cli("bench", "serve", str(smollm2_path), "--host", "127.0.0.1", "--base-url",
                            "http://127.0.0.1:8000"), "brigade bench serve",
                    "--base-url and --host/--port both name the server; give one")


# ---- 6: the serve script and the README ---------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]


def test_the_scripts_name_only_documents_in_the_repo():
    import re

    for script in sorted((REPO / "scripts").glob("*.sh")):
        for name in re.findall(r"[\w./-]+\.md\b", script.read_text()):
            assert (REPO / name).is_file(), f"{script.name} refers to {name}, which is not in the repository"


@pytest.fixture
def other_model(smollm2_path, tmp_path):
    folder = tmp_path / "other-model"
    folder.mkdir()
    for item in Path(smollm2_path).iterdir():
        (folder / item.name).symlink_to(item)
    return folder


def test_serve_script_serves_a_model_given_with_model(other_model):
    """./scripts/serve.sh --model X used to fail: 'MODEL ... and --model ... disagree'."""
    import httpx

    port = find_free_port()
    env = {k: v for k, v in os.environ.items() if k != "BRIGADE_LOGGING_LEVEL"}
    proc = subprocess.Popen([str(REPO / "scripts" / "serve.sh"), "--model", str(other_model), "--port", str(port),
                             "--max-model-len", "64"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            try:
                models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2)
                if models.status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.5)
        assert [m["id"] for m in models.json()["data"]] == ["other-model"]
    finally:
        proc.terminate()
        out = proc.communicate(timeout=60)[0]
    assert f"starting brigade serve {other_model} on http://127.0.0.1:{port}" in out
    assert '"model": "other-model"' in out  # the printed examples name it


def test_serve_script_takes_the_model_as_its_first_argument(other_model):
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:  # it parses, checks, then cannot bind
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = subprocess.run([str(REPO / "scripts" / "serve.sh"), str(other_model), "--port", str(port)],
                              capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1].startswith(f"brigade serve: error: cannot listen on 127.0.0.1:{port}")
    assert "disagree" not in proc.stderr and f'"model": "other-model"' in proc.stdout


def test_readme_says_where_brigade_serve_listens(server):
    import httpx

    readme = (REPO / "README.md").read_text()
    assert "plain `brigade serve` listens on `0.0.0.0`" in readme and "`--host 127.0.0.1`" in readme
    assert "--host 0.0.0.0" in (REPO / "scripts" / "serve.sh").read_text()
    assert "address to listen on (default 0.0.0.0)" in run_cli("serve", "--help").stdout
    # /docs: FastAPI's page, whose assets come from a CDN (said in docs/server.md and --help); the schema is local
    page = httpx.get(server.url("/docs"), timeout=30)
    assert page.status_code == 200 and "cdn.jsdelivr.net" in page.text
    assert httpx.get(server.url("/openapi.json"), timeout=30).status_code == 200
    server_doc = (REPO / "docs" / "server.md").read_text()  # the README links it for the server's behaviours
    assert "cdn.jsdelivr.net" in server_doc and "--disable-fastapi-docs" in server_doc


def test_a_config_that_transformers_cannot_read_is_one_line(remote_code_model, tmp_path):
    """The folder's own config code missing (OSError from transformers), and a config.json that is not JSON:
    one line each, not a traceback."""
    env = {"HF_HOME": str(tmp_path / "hf-home")}
    (remote_code_model / "configuration_review12.py").unlink()
    missing = run_cli("serve", str(remote_code_model), "--trust-remote-code", env=env)
    assert_one_line(missing, "brigade serve", "cannot read the config of")
    (remote_code_model / "config.json").write_text("{not json")
    broken = run_cli("serve", str(remote_code_model), env=env)
    assert_one_line(broken, "brigade serve", "cannot read the config of")
