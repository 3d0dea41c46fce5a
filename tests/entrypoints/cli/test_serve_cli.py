"""``brigade serve`` flags: vLLM's names map onto BrigadeConfig; bad values give one line and exit 2."""

from __future__ import annotations

import argparse
import os
import subprocess

import pytest
import torch
from cli_runner import run_main
from remote_server import brigade_command

from brigade.config import ConfigError
from brigade.entrypoints.cli import serve
from brigade.entrypoints.cli.engine_args import config_from_args, runnable_config_from_args

CHOICES = {"quantization": ["fp8"], "attention_backend": ["reference", "triton"], "kv_connector": ["shm"],
           "io_processor": ["structured_text"]}


def parse(*argv: str, choices=CHOICES) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="brigade")
    serve.add_parser(parser.add_subparsers(dest="command"), choices)
    return parser.parse_args(["serve", *argv])


def test_flags_map_onto_the_config(smollm2_path, monkeypatch):
    args = parse(str(smollm2_path), "--served-model-name", "smol", "--dtype", "bfloat16", "--max-model-len", "1024",
                 "--gpu-memory-utilization", "0.5", "--kv-cache-memory", "0.5", "--num-gpu-blocks-override", "64",
                 "--max-num-seqs", "4", "--max-num-batched-tokens", "512", "--block-size", "32",
                 "--no-enable-prefix-caching", "--enforce-eager", "-O0", "-tp", "2", "-pp", "1", "-dp", "1",
                 "--distributed-executor-backend", "mp", "-q", "fp8", "--kv-cache-dtype", "bfloat16",
                 "--kv-transfer-config", '{"kv_connector": "shm", "kv_role": "kv_producer"}', "--load-format", "dummy",
                 "--seed", "7", "--attention-backend", "reference", "--generation-config", "none",
                 "--io-processor-plugin", "structured_text", "--port", "9001", "--disable-log-requests")
    config = config_from_args(args)
    mc, cc, sc, pc = config.model_config, config.cache_config, config.scheduler_config, config.parallel_config
    assert (mc.model, mc.name, mc.dtype, mc.max_model_len, mc.seed) == (str(smollm2_path), "smol", "bfloat16", 1024, 7)
    assert (mc.quantization, mc.enforce_eager, mc.load_format, mc.generation_config) == ("fp8", True, "dummy", "none")
    assert mc.io_processor_plugin == "structured_text"
    assert (cc.gpu_memory_utilization, cc.kv_cache_memory_gib, cc.num_gpu_blocks_override) == (0.5, 0.5, 64)
    assert (cc.block_size, cc.enable_prefix_caching, cc.cache_dtype) == (32, False, "bfloat16")
    assert (sc.max_num_seqs, sc.max_num_batched_tokens) == (4, 512)
    assert (pc.tensor_parallel_size, pc.distributed_executor_backend) == (2, "mp")
    assert config.compilation_config.level == 0 and config.attention_backend == "reference"
    assert (config.kv_transfer_config.kv_connector, config.kv_transfer_config.kv_role) == ("shm", "kv_producer")
    monkeypatch.setenv("BRIGADE_API_KEY", "from-env")
    settings = serve.settings_from_args(args)
    assert (settings.port, settings.api_key, settings.log_requests) == (9001, "from-env", False)
    assert serve.settings_from_args(parse(str(smollm2_path), "--api-key", "flag")).api_key == "flag"


def test_defaults_and_model_flag(smollm2_path):
    config = config_from_args(parse("--model", str(smollm2_path)))
    assert config.model_config.model == str(smollm2_path)
    assert config.cache_config.enable_prefix_caching and config.cache_config.gpu_memory_utilization == 0.9
    assert config.compilation_config.level == 2 and config.kv_transfer_config is None
    assert parse(str(smollm2_path)).port == 8000


@pytest.mark.parametrize("flags,expected", [
    (["--dtype", "float8"], "--dtype 'float8' is not known; use one of auto, bfloat16, float16, float32"),
    (["-O7"], "-O7 is not a level; use -O0, -O1, -O2 or -O3"),
    (["--block-size", "12"], "--block-size must be a power of two"),
    (["--max-num-seqs", "0"], "--max-num-seqs must be at least 1"),
    (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization must be in (0, 1]"),
    (["-tp", "0"], "--tensor-parallel-size must be at least 1"),
    (["-q", "awq"], "--quantization 'awq' is not installed; installed: fp8"),
    (["--attention-backend", "flash"], "--attention-backend 'flash' is not installed; installed: reference, triton"),
    (["--kv-transfer-config", "{bad"], "--kv-transfer-config is not valid JSON"),
    (["--kv-transfer-config", '{"kv_connector": "nixl"}'],
     "--kv-transfer-config kv_connector 'nixl' is not installed; installed: shm"),
    (["--kv-transfer-config", '{"kv_connector": "shm", "kv_rank": 0}'],
     "--kv-transfer-config has unknown keys ['kv_rank']; allowed: kv_connector, kv_role, kv_connector_extra_config"),
    (["--kv-transfer-config", '{"kv_connector": "shm", "kv_role": "both"}'], "kv_role 'both' is not known"),
    (["--chat-template", "/no/such/template.jinja"],
     "--chat-template '/no/such/template.jinja' is not a file and has no Jinja markup"),
    (["--tokenizer", "/no/such/tokenizer"], "--tokenizer '/no/such/tokenizer' is not a folder"),
    (["--generation-config", "/no/such/dir"], "--generation-config '/no/such/dir' is not a folder; use auto, none"),
    (["--long-prefill-token-threshold", "-1"], "--long-prefill-token-threshold must be 0 (off) or more, got -1"),
    # fp8 (e4m3) KV caches are stored; vLLM's e5m2 one is not: refused, not ignored.
    (["--kv-cache-dtype", "fp8_e5m2"], "--kv-cache-dtype fp8_e5m2 is not supported: the fp8 KV cache is e4m3"),
    (["--kv-cache-dtype", "int4"], "--kv-cache-dtype 'int4' is not known; use auto (the model dtype), the model "
                                   "dtype's own name (whichever of bfloat16, float16, float32 it runs in), or fp8 "
                                   "(alias fp8_e4m3)"),
])
def test_bad_values_name_the_flag(smollm2_path, flags, expected):
    with pytest.raises(ConfigError) as info:
        config_from_args(parse(str(smollm2_path), *flags))
    assert expected in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("flags,expected", [
    (["-q", "fp9"], "--quantization 'fp9' is not installed; installed: fp8 (did you mean 'fp8'?)"),
    (["--quantization", "FP8"], "(did you mean 'fp8'?)"),
    (["--attention-backend", "refrence"], "installed: reference, triton (did you mean 'reference'?)"),
    (["-q", "awq"], "--quantization 'awq' is not installed; installed: fp8"),  # nothing close: no guess
])
def test_a_mistyped_plugin_name_gets_a_did_you_mean(smollm2_path, flags, expected):
    with pytest.raises(ConfigError) as info:
        config_from_args(parse(str(smollm2_path), *flags))
    message = str(info.value)
    assert message.endswith(expected) and message.count("did you mean") == ("did you mean" in expected)


@pytest.mark.parametrize("flags,expected", [
    (["-pp", "2", "--kv-transfer-config", '{"kv_connector": "shm", "kv_role": "kv_both"}'],
     "--kv-transfer-config (a KV connector) with pipeline parallelism (-pp 2) is not supported yet"),
    (["-dp", "2", "--kv-transfer-config", '{"kv_connector": "shm", "kv_role": "kv_both"}'],
     "--kv-transfer-config (shm) with -dp 2 is not supported: each engine would run its own connector"),
    (["-tp", "3", "--distributed-executor-backend", "uni"], "--distributed-executor-backend uni runs one worker"),
    # The parser's choices listed "shm", but no installed plugin registers it: the registry has the last word.
    (["--kv-transfer-config", '{"kv_connector": "shm"}'], "--kv-transfer-config kv_connector 'shm' is not installed"),
])
def test_flags_this_build_cannot_run_are_refused(smollm2_path, flags, expected):
    """vLLM's flags parse, but what the engine cannot run is refused in one line instead of ignored."""
    with pytest.raises(ConfigError) as info:
        runnable_config_from_args(parse(str(smollm2_path), *flags))
    assert expected in str(info.value) and "\n" not in str(info.value)


def test_chat_template_text_is_still_accepted(smollm2_path, tmp_path):
    template = tmp_path / "t.jinja"
    template.write_text("{{ messages[0]['content'] }}")
    for value in (str(template), "{% for m in messages %}{{ m['content'] }}{% endfor %}"):
        assert config_from_args(parse(str(smollm2_path), "--chat-template", value)).model_config.chat_template == value


def test_model_errors(monkeypatch, tmp_path):
    monkeypatch.setenv("BRIGADE_CACHE_DIR", str(tmp_path))  # no set-up model to fall back on
    with pytest.raises(ConfigError, match="no model given"):
        config_from_args(parse())
    with pytest.raises(ConfigError, match="does not exist"):
        config_from_args(parse("/no/such/model"))
    with pytest.raises(ConfigError, match="disagree"):
        config_from_args(parse("/a", "--model", "/b"))


def test_generate_model_errors_show_its_own_usage(smollm2_path, tmp_path):
    """`brigade generate` takes PROMPT then MODEL; its errors say so, and spot the two swapped."""
    missing = run_main("generate", "Hello", env={"BRIGADE_CACHE_DIR": str(tmp_path)})  # no set-up model
    assert missing.returncode != 0
    assert "no model given" in missing.stderr and "brigade generate PROMPT MODEL" in missing.stderr
    swapped = run_main("generate", str(smollm2_path), "Hello")
    assert swapped.returncode != 0 and "the prompt comes first" in swapped.stderr


@pytest.mark.parametrize("flags,needle", [
    (["--kv-transfer-config", "{bad"], "--kv-transfer-config is not valid JSON"),
    (["--port", "abc"], "argument --port: invalid int value: 'abc'"),
])
def test_cli_exits_2_with_one_line(smollm2_path, flags, needle):
    result = run_main("serve", str(smollm2_path), *flags, env={"BRIGADE_LOGGING_LEVEL": "ERROR"})
    assert result.returncode == 2, result.stderr
    error_lines = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert len(error_lines) == 1 and needle in error_lines[0], result.stderr
    assert "usage:" not in result.stderr


BAD_FLAG_LINES = [
    (["serve", "{model}", "--max-model-len", "abc"], "brigade serve: error: argument --max-model-len: invalid int value"),
    (["serve", "{model}", "--bogus-flag"], "brigade serve: error: unrecognized arguments: --bogus-flag"),
    (["bench", "latency", "{model}", "--bogus"], "brigade bench latency: error: unrecognized arguments: --bogus"),
    (["serve", "{model}", "--dtype", "float7"], "brigade serve: error: --dtype 'float7' is not known; use one of"),
    (["serve", "{model}", "--port", "99999"], "brigade serve: error: --port must be in 0..65535, got 99999"),
    (["serve", "{model}", "--max-model-len", "100000"],
     "brigade serve: error: --max-model-len 100000 exceeds the model's max_position_embeddings (8192)"),
]


def _only_the_error_line(result: subprocess.CompletedProcess, line: str) -> None:
    assert result.returncode == 2, result.stderr
    assert line in result.stderr.splitlines()[-1], result.stderr
    assert len(result.stderr.splitlines()) == 1 and "loaded plugin" not in result.stderr


@pytest.mark.parametrize("argv,line", BAD_FLAG_LINES)
def test_a_bad_flag_prints_only_its_error_at_the_default_log_level(smollm2_path, argv, line):
    """With the default log level, the plugin loader's start-up lines wait until the command line has parsed
    and, for serve, until its flags pass the checks that need no engine (against config.json too): a bad flag
    prints one line, argparse's error without the usage block; an unknown flag is reported by the subcommand
    that received it."""
    _only_the_error_line(run_main(*[a.format(model=smollm2_path) for a in argv]), line)


@pytest.mark.parametrize("argv,line", [BAD_FLAG_LINES[1], BAD_FLAG_LINES[5]])  # a parser's error, a check's
def test_a_bad_flag_holds_the_plugin_start_up_lines(smollm2_path, argv, line):
    """In a fresh ``brigade`` process, where the plugins load (and log) as the command starts, the error is
    still the only line."""
    env = {k: v for k, v in os.environ.items() if k != "BRIGADE_LOGGING_LEVEL"}
    result = subprocess.run([*brigade_command(), *[a.format(model=smollm2_path) for a in argv]],
                            capture_output=True, text=True, timeout=120, env=env)
    _only_the_error_line(result, line)


def test_help_has_no_log_lines():
    env = {k: v for k, v in os.environ.items() if k != "BRIGADE_LOGGING_LEVEL"}
    result = subprocess.run([*brigade_command(), "serve", "--help"], capture_output=True, text=True, timeout=120,
                            env=env)
    assert result.returncode == 0 and result.stdout.startswith("usage: brigade serve")
    assert result.stderr == ""


def test_kv_cache_memory_beyond_ram_is_refused_before_loading(smollm2_path, free_port):
    """On the CPU the KV pool lives in RAM: asking for more than the machine has is one line, up front."""
    proc = run_main("serve", str(smollm2_path), "--kv-cache-memory", "100000", "--host", "127.0.0.1", "--port",
                    str(free_port))
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if "error" in line]
    assert len(errors) == 1 and "--kv-cache-memory 100000 GiB is more than this machine's" in errors[0]
    assert "tensors from" not in proc.stderr  # refused before any weight was read


@pytest.mark.parametrize("flags,expected,code", [
    (["-tp", "2"], "-tp 2 does not divide the model's 9 attention heads; use one of 1, 3, 9", 2),
    (["--host", "999.1.1.1", "--port", "8799"], "check --host", 1),
])
def test_serve_refuses_before_starting_the_engine(smollm2_path, flags, expected, code):
    if code == 2:  # serve's checks, before anything binds: in this process
        proc = run_main("serve", str(smollm2_path), *flags)
    else:  # the address cannot be bound: a brigade process, so that nothing listens in this one
        proc = subprocess.run([*brigade_command(), "serve", str(smollm2_path), *flags], capture_output=True,
                              text=True, timeout=120)
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert proc.returncode == code and len(errors) == 1 and expected in errors[0], proc.stderr[-2000:]
    assert "tensors from" not in proc.stderr  # no model was loaded


@pytest.mark.parametrize("command", [["generate", "Hello"], ["bench", "latency"], ["bench", "throughput"]])
def test_other_commands_refuse_parallelism_before_loading(smollm2_path, command):
    """`-tp 2` (which does not divide SmolLM2's 9 heads) is refused in one line by every command that starts an
    engine, before any weight is read."""
    argv = [*command[:1], *command[1:], str(smollm2_path)] if command[0] == "generate" else [*command, str(smollm2_path)]
    proc = run_main(*argv, "-tp", "2")
    errors = [line for line in proc.stderr.splitlines()
              if "-tp 2 does not divide the model's 9 attention heads" in line]
    assert proc.returncode == 2 and len(errors) == 1, proc.stderr[-2000:]
    assert "tensors from" not in proc.stderr


def test_llm_refuses_a_kv_connector_no_plugin_registers(smollm2_path):
    """A configured KV connector is never ignored: an unknown one is refused, naming it, before loading weights
    (tests/kv_transfer runs a real one)."""
    from brigade.config import ConfigError
    from brigade.entrypoints.llm import LLM

    with pytest.raises(ConfigError, match=r"^--kv-transfer-config kv_connector 'shm' is not installed; installed: "):
        LLM(str(smollm2_path), kv_transfer_config={"kv_connector": "shm", "kv_role": "kv_both"})


def test_kv_cache_smaller_than_one_request_is_refused_at_start(smollm2_path):
    """A cache that cannot hold one max_model_len request is refused (it would wait forever at the head of the
    queue, holding every request behind it), in one line, naming both ways out."""
    from brigade.config import ConfigError
    from brigade.entrypoints.llm import LLM

    with pytest.raises(ConfigError, match=r"the KV cache holds 48 tokens \(3 usable blocks of 16\), fewer than one "
                                          r"request of --max-model-len 512; .* or set --max-model-len 48 or less"):
        LLM(str(smollm2_path), max_model_len=512, num_gpu_blocks_override=4, block_size=16)
    # At the boundary: 12 blocks are 11 usable (block 0 is the null block), 176 tokens. A 192-token request
    # used to pass this check and then preempt itself at every step, wedging the engine.
    with pytest.raises(ConfigError, match=r"holds 176 tokens \(11 usable blocks of 16\)"):
        LLM(str(smollm2_path), max_model_len=192, num_gpu_blocks_override=12, block_size=16)
    proc = run_main("serve", str(smollm2_path), "--max-model-len", "512", "--num-gpu-blocks-override", "4", "--port",
                    "8797")
    errors = [line for line in proc.stderr.splitlines() if "fewer than one request" in line]
    assert proc.returncode != 0 and len(errors) == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_bench_errors_are_one_line(smollm2_path):
    """A request set that cannot fit, and a server that is not there, are one line each, no traceback."""
    too_long = run_main("bench", "throughput", str(smollm2_path), "--input-len", "9000", "--output-len", "8",
                        "--num-prompts", "2")
    assert too_long.returncode == 2 and "Traceback" not in too_long.stderr, too_long.stderr[-2000:]
    assert "--input-len 9000 + --output-len 8 exceeds the max model length" in too_long.stderr
    nobody = run_main("bench", "serve", str(smollm2_path), "--base-url", "http://127.0.0.1:9", "--num-prompts", "2")
    assert nobody.returncode == 2 and "Traceback" not in nobody.stderr, nobody.stderr[-2000:]
    assert "cannot reach a server at http://127.0.0.1:9" in nobody.stderr and "--launch" in nobody.stderr


def _all_parsers(parser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _all_parsers(sub)


def test_every_flag_of_every_command_says_what_it_does():
    """``--help`` of each command explains each of its flags, none is bare."""
    from brigade.entrypoints.cli.main import build_parser
    from brigade.plugins import load_plugins, plugin_choices

    load_plugins("api")
    bare = [f"{p.prog} {a.option_strings or a.dest}" for p in _all_parsers(build_parser(plugin_choices()))
            for a in p._actions if not isinstance(a, argparse._SubParsersAction) and not a.help]
    assert bare == []


def test_version_short_and_long():
    result = subprocess.run([*brigade_command(), "-V"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.startswith("brigade "), result.stderr
    result = run_main("--version")
    assert result.returncode == 0 and result.stdout.startswith("brigade "), result.stderr


def test_a_kv_cache_dtype_other_than_the_model_dtype_is_refused(smollm2_path):
    """--kv-cache-dtype naming the model dtype is the default cache; another dtype is refused in one line once
    the model dtype is resolved (on the CPU, --dtype auto is float32)."""
    from brigade import LLM

    with pytest.raises(ConfigError) as info:
        LLM(str(smollm2_path), kv_cache_dtype="float16", max_model_len=64, kv_cache_memory_gib=0.01)
    assert str(info.value) == ("--kv-cache-dtype float16 differs from the model dtype float32; the KV cache is kept in "
                               "the model dtype: use --kv-cache-dtype auto (or --dtype float16)")
    llm = LLM(str(smollm2_path), cache_dtype="float32", max_model_len=64, kv_cache_memory_gib=0.01)
    assert llm.engine.core.executor.worker.model_runner.kv_caches[0].dtype == torch.float32


def test_port_0_logs_the_port_the_system_chose(smollm2_path):
    """``--port 0`` binds a free port; the start-up line names that port (not 0), and the server answers on it."""
    import re
    import signal
    import time

    import httpx

    proc = subprocess.Popen([*brigade_command(), "serve", str(smollm2_path), "--host", "127.0.0.1", "--port", "0",
                             "--max-model-len", "128"], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        deadline, lines = time.monotonic() + 120, []
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            match = re.search(r"serving \S+ on http://127\.0\.0\.1:(\d+)$", line.strip())
            if match:
                break
        assert match and int(match.group(1)) > 0, "".join(lines[-20:])
        for _ in range(100):  # the line comes as uvicorn starts listening
            try:
                assert httpx.get(f"http://127.0.0.1:{match.group(1)}/health", timeout=10).status_code == 200
                break
            except httpx.ConnectError:
                time.sleep(0.1)
        else:
            raise AssertionError("nothing answers on the logged port")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
