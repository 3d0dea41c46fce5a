"""Bad ``brigade serve`` / ``brigade bench`` flags are one line from the subcommand that got them, exit 2, found
before anything loads or binds: --base-url with /v1, negative counts and timeouts, the bench subcommand's name,
a busy port hiding a config error, a folder with no tokenizer, an empty served name."""

from __future__ import annotations

import argparse
import socket

import pytest
from cli_runner import assert_one_line, run_cli, run_main, serve_args

from brigade.config import ConfigError
from brigade.entrypoints.cli import serve
from brigade.entrypoints.cli.engine_args import config_from_args


BAD_FLAGS = [
    # 2: counts and timeouts are refused while parsing
    (["bench", "serve", "{model}", "--launch", "--launch-timeout", "-5"], "brigade bench serve",
     "argument --launch-timeout: must be a positive number of seconds, got '-5'"),
    (["bench", "serve", "{model}", "--launch-timeout", "0"], "brigade bench serve",
     "argument --launch-timeout: must be a positive number of seconds"),
    (["bench", "latency", "{model}", "--num-iters-warmup", "-1"], "brigade bench latency",
     "argument --num-iters-warmup: must be at least 0, got -1"),
    (["bench", "latency", "{model}", "--num-iters", "0"], "brigade bench latency",
     "argument --num-iters: must be at least 1, got 0"),
    (["bench", "latency", "{model}", "--batch-size", "two"], "brigade bench latency",
     "argument --batch-size: expected a whole number of at least 1, got 'two'"),
    (["bench", "throughput", "{model}", "--num-prompts", "0"], "brigade bench throughput",
     "argument --num-prompts: must be at least 1, got 0"),
    (["bench", "throughput", "{model}", "--hf-batch-size", "-2"], "brigade bench throughput",
     "argument --hf-batch-size: must be at least 1, got -2"),
    (["bench", "throughput", "{model}", "--input-len", "0"], "brigade bench throughput",
     "argument --input-len: must be at least 1, got 0"),
    (["bench", "serve", "{model}", "--output-len", "-1"], "brigade bench serve",
     "argument --output-len: must be at least 1, got -1"),
    (["bench", "serve", "{model}", "--request-rate", "0"], "brigade bench serve",
     "argument --request-rate: must be a positive number of requests/s or inf, got '0'"),
    (["bench", "serve", "{model}", "--request-rate=-inf"], "brigade bench serve",
     "argument --request-rate: must be a positive number of requests/s or inf"),
    (["bench", "serve", "{model}", "--max-concurrency", "0"], "brigade bench serve",
     "argument --max-concurrency: must be at least 1, got 0"),
    # 1: --base-url takes the server's root; a trailing /v1 is dropped, other paths are refused
    (["bench", "serve", "{model}", "--base-url", "http://127.0.0.1:8000/v1/completions"], "brigade bench serve",
     "argument --base-url: 'http://127.0.0.1:8000/v1/completions' has a path; give http(s)://HOST:PORT"),
    (["bench", "serve", "{model}", "--base-url", "127.0.0.1:8000"], "brigade bench serve",
     "argument --base-url: '127.0.0.1:8000' is not an http(s) URL"),
    (["bench", "serve", "{model}", "--launch", "--base-url", "https://127.0.0.1:8000"], "brigade bench serve",
     "--launch starts a plain-HTTP server; give an http:// --base-url"),
    # 3: model errors come from the bench subcommand, with its own usage
    (["bench", "latency", "/nope"], "brigade bench latency", "MODEL '/nope' does not exist"),
    (["bench", "throughput", "/nope"], "brigade bench throughput", "MODEL '/nope' does not exist"),
    (["bench", "serve", "/nope"], "brigade bench serve", "MODEL '/nope' does not exist"),
    (["bench", "latency"], "brigade bench latency", "no model given; pass an HF-format model directory: "
                                                    "brigade bench latency MODEL"),
    # 5: a folder with no tokenizer files, before any tokenizer loads
    (["serve", "{model}", "--tokenizer", "{empty}"], "brigade serve",
     "--tokenizer '{empty}': no tokenizer files (tokenizer.json, tokenizer_config.json, "),
    (["bench", "serve", "{model}", "--tokenizer", "{empty}", "--base-url", "http://127.0.0.1:9"],
     "brigade bench serve", "--tokenizer '{empty}': no tokenizer files (tokenizer.json, "),
    # 6: an empty served name
    (["serve", "{model}", "--served-model-name", ""], "brigade serve", "--served-model-name '' is empty"),
    (["serve", "{model}", "--served-model-name", "  "], "brigade serve", "--served-model-name '  ' is empty"),
    (["serve", "{model}", "--served-model-name", "a", ""], "brigade serve", "--served-model-name '' is empty"),
    # --served-model-name takes several names (vLLM's nargs="+"): a MODEL after them is taken as one more
    (["serve", "--served-model-name", "a", "b", "{model}"], "brigade serve",
     "no model given: --served-model-name also took '{model}'; put MODEL before --served-model-name"),
    # 7: --compilation-config (vLLM's JSON form) and -O (braces doubled: the arguments go through str.format)
    (["serve", "{model}", "--compilation-config", '{{"cudagraph_mode": "FULL_AND_PIECEWISE"}}'], "brigade serve",
     "Brigade has no piecewise graphs; it captures mixed steps as full graphs: use FULL"),
    (["serve", "{model}", "-cc", '{{"cudagraph_mode": 1'], "brigade serve", "--compilation-config is not valid JSON"),
    (["serve", "{model}", "--compilation-config", '{{"max_capture_size": 64}}'], "brigade serve",
     "--compilation-config has unknown keys ['max_capture_size']; allowed: level, cudagraph_mode"),
    (["serve", "{model}", "-O3", "--compilation-config", '{{"level": 1}}'], "brigade serve",
     "-O3 and --compilation-config level 1 disagree; give one"),
    # 8: generate's text prompt needs the tokenizer; a sampling flag out of its range
    (["generate", "hi", "--model", "{model}", "--skip-tokenizer-init"], "brigade generate",
     "--skip-tokenizer-init: generate takes a text prompt, which needs the tokenizer; drop the flag"),
    (["generate", "hi", "--model", "{model}", "--top-p", "0"], "brigade generate", "--top-p: top_p must be in (0, 1]"),
]


def _bad_flag(run, smollm2_path, tmp_path, argv, prefix, needle):
    fill = {"model": str(smollm2_path), "empty": str(tmp_path)}
    # no set-up model to fall back on
    proc = run(*[a.format(**fill) for a in argv], env={"BRIGADE_CACHE_DIR": str(tmp_path / "cache")})
    assert_one_line(proc, prefix, needle.format(**fill))
    assert "tensors from" not in proc.stderr and "launching:" not in proc.stdout


@pytest.mark.parametrize("argv,prefix,needle", BAD_FLAGS)
def test_bad_flags_are_one_line_from_the_subcommand(smollm2_path, tmp_path, argv, prefix, needle):
    _bad_flag(run_main, smollm2_path, tmp_path, argv, prefix, needle)


@pytest.mark.parametrize("argv,prefix,needle", [
    BAD_FLAGS[4],  # a bench flag's value refused while parsing
    BAD_FLAGS[15],  # a bench subcommand's model check
    BAD_FLAGS[21],  # serve's check of its flags
])
def test_bad_flags_are_one_line_from_the_command(smollm2_path, tmp_path, argv, prefix, needle):
    """The same errors from the ``brigade`` process itself, one per code path above: exactly one stderr line in
    a fresh process (no plugin start-up lines, no warnings), exit 2."""
    _bad_flag(run_cli, smollm2_path, tmp_path, argv, prefix, needle)


def _bench_serve_args(*argv: str) -> argparse.Namespace:
    from brigade.entrypoints.cli.main import build_parser

    return build_parser({}).parse_args(["bench", "serve", *argv])


@pytest.mark.parametrize("given,kept", [
    ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000"),
    ("http://127.0.0.1:8000/v1/", "http://127.0.0.1:8000"),
    ("http://127.0.0.1:8000/", "http://127.0.0.1:8000"),
    ("https://bench.example:443", "https://bench.example:443"),
    ("http://[::1]:8000/v1", "http://[::1]:8000"),
])
def test_base_url_drops_a_trailing_v1(given, kept):
    """The usual OpenAI base URL (…/v1) is accepted: the benchmark appends /v1/models and /v1/completions."""
    assert _bench_serve_args("--base-url", given).base_url == kept
    assert _bench_serve_args().base_url == "http://127.0.0.1:8000"


def test_zero_warmup_and_inf_rate_are_still_accepted():
    from brigade.entrypoints.cli.main import build_parser

    parser = build_parser({})
    assert parser.parse_args(["bench", "latency", "--num-iters-warmup", "0"]).num_iters_warmup == 0
    assert _bench_serve_args("--request-rate", "inf", "--launch-timeout", "0.5").launch_timeout == 0.5


def test_a_busy_port_does_not_hide_a_config_error(smollm2_path):
    """serve's config checks (here the CPU's --kv-cache-memory against the RAM) run before the port is bound:
    with the port taken, the answer is still the config's one line and exit 2, not 'Address already in use'."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = run_cli("serve", str(smollm2_path), "--kv-cache-memory", "100000", "--host", "127.0.0.1",
                       "--port", str(port))
        assert_one_line(proc, "brigade serve", "--kv-cache-memory 100000 GiB is more than this machine's")
        flag = run_main("serve", str(smollm2_path), "--served-model-name", "", "--host", "127.0.0.1", "--port",
                        str(port))
        assert_one_line(flag, "brigade serve", "--served-model-name '' is empty")


def test_serve_run_checks_before_binding_when_called_directly(smollm2_path, capsys):
    """``serve.run`` without brigade's main (which runs ``check`` first) still refuses before binding."""
    parser = argparse.ArgumentParser(prog="brigade")
    serve.add_parser(parser.add_subparsers(dest="command"), {})
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:  # were the check skipped: exit 1, no server
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        args = parser.parse_args(["serve", str(smollm2_path), "--kv-cache-memory", "100000", "--host", "127.0.0.1",
                                  "--port", str(busy.getsockname()[1])])
        with pytest.raises(SystemExit) as info:
            serve.run(args)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("brigade serve: error: --kv-cache-memory 100000 GiB") and "cannot listen" not in err


def test_tokenizer_folder_check(smollm2_path, tmp_path):
    """A folder with any tokenizer file passes the cheap check; --skip-tokenizer-init loads none, so none is needed."""
    config = config_from_args(serve_args(str(smollm2_path), "--tokenizer", str(smollm2_path)))
    assert config.model_config.tokenizer == str(smollm2_path)
    (tmp_path / "tokenizer.model").write_bytes(b"")
    assert config_from_args(serve_args(str(smollm2_path), "--tokenizer", str(tmp_path))).model_config.tokenizer
    empty = tmp_path / "empty"
    empty.mkdir()
    assert config_from_args(serve_args(str(smollm2_path), "--tokenizer", str(empty), "--skip-tokenizer-init"))
    with pytest.raises(ConfigError, match="no tokenizer files"):
        config_from_args(serve_args(str(smollm2_path), "--tokenizer", str(empty)))


def test_served_model_name_is_kept(smollm2_path):
    assert config_from_args(serve_args(str(smollm2_path), "--served-model-name", "smol")).model_config.name == "smol"


def test_several_served_model_names(smollm2_path, tmp_path):
    """``--served-model-name a b`` (vLLM's nargs="+"): every name is served, the first is the model's name; a LoRA
    adapter may take none of them (requests naming it could not reach the adapter)."""
    model_config = config_from_args(serve_args(str(smollm2_path), "--served-model-name", "a", "b",
                                                "--max-model-len", "64")).model_config
    assert model_config.name == "a" and model_config.served_model_names == ["a", "b"]
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    with pytest.raises(ConfigError, match="adapter name 'b' is the served model's name"):
        config_from_args(serve_args(str(smollm2_path), "--served-model-name", "a", "b", "--enable-lora",
                                     "--lora-modules", f"b={adapter}"))
    from brigade.config import config_from_kwargs

    assert config_from_kwargs(str(smollm2_path), served_model_name=["x", "y"]).model_config.name == "x"
    assert config_from_kwargs(str(smollm2_path)).model_config.served_model_names == [smollm2_path.name]


def test_a_chat_template_that_does_not_compile_is_one_line_at_start(smollm2_path, tmp_path):
    # It used to start, then answer every chat request with a 400 blaming the client's messages.
    assert_one_line(run_main("serve", str(smollm2_path), "--chat-template", "{% if %}"), "brigade serve",
                    "--chat-template does not compile: Expected an expression")
    broken = tmp_path / "broken.jinja"
    broken.write_text("{{ messages[0]['content'] }}\n{% for m in messages %}\n")
    assert_one_line(run_main("generate", "hi", "--model", str(smollm2_path), "--chat-template", str(broken)),
                    "brigade generate", f"--chat-template {broken} does not compile:")
    good = tmp_path / "good.jinja"
    good.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    from brigade.entrypoints.cli.engine_args import check_chat_template

    check_chat_template(str(good))  # compiles: no error


def test_a_broken_tokenizer_file_is_one_error_line_not_a_traceback(smollm2_path, tmp_path):
    (tmp_path / "tokenizer.json").write_text("{}")  # transformers raises KeyError('added_tokens') on it
    proc = run_cli("generate", "hi", "--model", str(smollm2_path), "--tokenizer", str(tmp_path))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"brigade generate: error: cannot load a tokenizer from {str(tmp_path)!r}: KeyError: 'added_tokens'")
    assert "KV cache" not in proc.stderr, proc.stderr[-2000:]  # refused before the engine loaded the weights


def test_an_empty_api_key_is_refused(smollm2_path):
    assert_one_line(run_main("serve", str(smollm2_path), "--api-key", ""), "brigade serve",
                    "--api-key is empty, which would serve without any key")


def test_underscore_flags_mean_the_dashed_ones():
    """vLLM users write --max_model_len and --speculative_config: the name part is normalized, values are not."""
    from brigade.entrypoints.cli.main import normalize_flag_spelling

    argv = ["serve", "m", "--max_model_len", "64", "--speculative_config={\"method\": \"ngram\"}",
            "--lora-modules", "my_adapter=/a/b_c", "--", "--not_a_flag"]
    assert normalize_flag_spelling(argv) == [
        "serve", "m", "--max-model-len", "64", "--speculative-config={\"method\": \"ngram\"}",
        "--lora-modules", "my_adapter=/a/b_c", "--", "--not_a_flag"]


def test_an_underscore_flag_reaches_its_check(smollm2_path):
    proc = run_main("serve", str(smollm2_path), "--max_model_len", "0")
    assert_one_line(proc, "brigade serve", "max-model-len")


def test_brigade_without_a_command_prints_the_help_and_succeeds():
    """As ``vllm`` with no command: the usage and the commands, exit 0 (a shell's ``brigade && ...`` goes on)."""
    proc = run_cli()
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("usage: brigade") and "serve" in proc.stdout and "bench" in proc.stdout
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("command", [["generate", "Hi", "--model", "{model}"],
                                     ["bench", "latency", "{model}", "--input-len", "8", "--output-len", "2"]])
def test_an_in_process_engine_that_cannot_start_is_one_line(smollm2_path, command):
    """generate and bench run their engine in this process: an engine that cannot start on this platform (the
    Triton backend on the CPU) is one line and exit 1, as serve gives for its engine process, not a traceback."""
    argv = [arg.replace("{model}", str(smollm2_path)) for arg in command] + ["--attention-backend", "triton"]
    proc = run_main(*argv)
    # generate's INFO start-up lines (the platform it fell back to) may come first; the error is the one other line
    proc.stderr = "\n".join(line for line in proc.stderr.splitlines() if not line.startswith("INFO ")) + "\n"
    name = "brigade " + (" ".join(command[:2]) if command[0] == "bench" else command[0])
    assert_one_line(proc, name, "attention backend 'triton' cannot run this model: triton runs on "
                    "cuda, not cpu", status=1)


def test_a_model_that_fails_to_load_is_one_line_from_generate_and_bench(smollm2_path, tmp_path):
    """An engine in the command's own process (generate, bench latency) that fails while loading its weights
    is one line, exit 1, as ``brigade serve`` reports its engine process's failure."""
    import shutil

    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(smollm2_path / name, tmp_path / name)  # everything but the weights
    for argv, command in ((["generate", "hi", "--model", str(tmp_path)], "brigade generate"),
                          (["bench", "latency", str(tmp_path), "--batch-size", "1", "--input-len", "4",
                            "--output-len", "2", "--num-iters-warmup", "0", "--num-iters", "1"],
                           "brigade bench latency")):
        proc = run_cli(*argv)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith(f"{command}: error: the engine failed to start: FileNotFoundError: ") \
            and "safetensors" in last, last
