"""LoRA through ``brigade serve`` on loopback with the official openai client: /v1/models lists the adapters
as vLLM does, ``model=<adapter>`` runs it (completions and chat) and is named in the response, an unknown
model is a 404 in OpenAI's shape; and bad LoRA flags are one line from the CLI before anything loads."""

from __future__ import annotations

import openai
import pytest
from lora_utils import MAX_NEW_TOKENS, PROMPTS
from remote_server import RemoteServer
from cli_runner import assert_one_line, run_main

from brigade import LLM, SamplingParams
from brigade.config import ConfigError
from brigade.entrypoints.cli import serve
from brigade.lora import LoRARequest


@pytest.fixture(scope="module")
def server(smollm2_path, lora_adapters):
    modules = [f"{name}={path}" for name, path in lora_adapters.items()]
    srv = RemoteServer(smollm2_path, ["--dtype", "float32", "--max-model-len", "256", "--kv-cache-memory", "0.1",
                                      "--served-model-name", "smol", "--enable-lora", "--max-loras", "2",
                                      "--max-lora-rank", "8", "--lora-modules", *modules,
                                      "--disable-log-requests"],
                       env={"BRIGADE_ALLOW_RUNTIME_LORA_UPDATING": "0"})  # whatever the tester's environment says
    yield srv
    srv.stop()


def test_models_lists_the_model_and_its_adapters(server, lora_adapters):
    client = server.openai_client()
    cards = {m.id: m for m in client.models.list().data}
    assert list(cards) == ["smol", *lora_adapters]
    for name, path in lora_adapters.items():
        assert cards[name].parent == "smol" and cards[name].root == str(path)
    assert cards["smol"].parent is None
    assert client.models.retrieve("poet").parent == "smol"


def test_completion_with_an_adapter_matches_the_offline_engine(server, smollm2_path, lora_adapters):
    client = server.openai_client()
    texts = {}
    for name in ("sql", "poet", "smol"):
        resp = client.completions.create(model=name, prompt=PROMPTS[0], max_tokens=MAX_NEW_TOKENS, temperature=0,
                                         extra_body={"ignore_eos": True})
        assert resp.model == name
        texts[name] = resp.choices[0].text
        assert texts[name] == _offline_text(smollm2_path, lora_adapters, None if name == "smol" else name), name
    assert len(set(texts.values())) == 3, texts


_OFFLINE: dict = {}


def _offline_text(smollm2_path, lora_adapters, lora: str | None) -> str:
    """The offline engine's greedy text for PROMPTS[0] (one engine for the module)."""
    if "llm" not in _OFFLINE:
        _OFFLINE["llm"] = LLM(str(smollm2_path), dtype="float32", max_model_len=256, kv_cache_memory_gib=0.1,
                              enable_lora=True, max_loras=2, max_lora_rank=8)
    request = None if lora is None else LoRARequest(lora, 1 + list(lora_adapters).index(lora), str(lora_adapters[lora]))
    params = SamplingParams(temperature=0, max_tokens=MAX_NEW_TOKENS, ignore_eos=True)
    return _OFFLINE["llm"].generate(PROMPTS[0], params, use_tqdm=False, lora_request=request)[0].outputs[0].text


def test_chat_with_an_adapter_names_it_and_differs_from_the_base(server):
    client = server.openai_client()
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    texts = {}
    for model in ("smol", "poet"):
        resp = client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=0)
        assert resp.model == model
        texts[model] = resp.choices[0].message.content
    assert texts["smol"] != texts["poet"]
    chunks = list(client.chat.completions.create(model="sql", messages=messages, max_tokens=4, temperature=0,
                                                 stream=True))
    assert chunks and all(c.model == "sql" for c in chunks)


def test_an_unknown_model_is_a_404_naming_the_adapters(server):
    client = server.openai_client()
    with pytest.raises(openai.NotFoundError) as info:
        client.completions.create(model="nope", prompt="hi", max_tokens=2)
    body = info.value.body
    assert body["code"] == "model_not_found" and body["param"] == "model" and body["type"]
    assert "'nope' does not exist" in body["message"] and "'sql'" in body["message"]
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nope")


def test_runtime_lora_routes_are_absent_without_the_switch(server):
    """Without BRIGADE_ALLOW_RUNTIME_LORA_UPDATING (test_lora_runtime.py turns it on), /v1/load_lora_adapter and
    /v1/unload_lora_adapter are unknown routes, a 404 in OpenAI's shape, as in vLLM without its variable."""
    import httpx

    for route in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
        response = httpx.post(server.url(route), json={"lora_name": "x", "lora_path": "/tmp"}, timeout=30)
        assert response.status_code == 404 and response.json()["error"]["type"] == "not_found_error", response.text
    assert [m.id for m in server.openai_client().models.list().data] == ["smol", "sql", "poet"]


def _check(*argv: str) -> None:
    """serve's start-up checks, in process (what ``brigade serve`` runs before anything loads)."""
    from cli_runner import serve_args

    serve.check(serve_args(*argv))


@pytest.mark.parametrize("argv,needle", [
    (["--lora-modules", "a={sql}"], "--lora-modules needs --enable-lora"),
    (["--enable-lora", "--lora-modules", "{sql}"], "--lora-modules '{sql}' is not NAME=PATH"),
    (["--enable-lora", "--lora-modules", "a={sql}", "a={poet}"], "--lora-modules: adapter name 'a' is given twice"),
    (["--enable-lora", "--lora-modules", "a={sql}", "--lora-modules", "a={poet}"], "adapter name 'a' is given twice"),
    (["--enable-lora", "--served-model-name", "smol", "--lora-modules", "smol={sql}"],
     "--lora-modules: adapter name 'smol' is the served model's name"),
    (["--enable-lora", "--lora-modules", "a=/nowhere"], "--lora-modules a=/nowhere: '/nowhere' is not a folder"),
    (["--enable-lora", "--max-lora-rank", "1", "--lora-modules", "a={sql}"],
     "LoRA adapter 'a' ({sql}): rank 8 is above --max-lora-rank 1"),
    (["--enable-lora", "--max-loras", "0"], "--max-loras must be at least 1, got 0"),
    (["--enable-lora", "--max-loras", "3", "--max-cpu-loras", "2"],
     "--max-cpu-loras must be at least --max-loras (3), got 2: the host cache holds every adapter of a batch; "
     "give --max-cpu-loras 3 or more, or leave it out (it defaults to --max-loras)"),
    (["--enable-lora", "--max-cpu-loras", "0"], "--max-cpu-loras must be at least --max-loras (1), got 0"),
    (["--enable-lora", "--max-lora-rank", "100000"],
     "--max-lora-rank must be one of 1, 8, 16, 32, 64, 128, 256, 320, 512 (as in vLLM), got 100000"),
])
def test_bad_lora_flags_are_refused_before_start(smollm2_path, lora_adapters, argv, needle):
    fill = {name: str(path) for name, path in lora_adapters.items()}
    with pytest.raises(ConfigError) as info:
        _check(str(smollm2_path), *[a.format(**fill) for a in argv])
    assert needle.format(**fill) in str(info.value) and "\n" not in str(info.value)


def test_a_model_after_lora_modules_is_named_in_the_error(smollm2_path, lora_adapters):
    """--lora-modules takes several values, so a MODEL after it is read as one more adapter (argparse)."""
    with pytest.raises(ConfigError) as info:
        _check("--enable-lora", "--lora-modules", f"sql={lora_adapters['sql']}", str(smollm2_path))
    assert f"--lora-modules also took {str(smollm2_path)!r}; put MODEL before --lora-modules" in str(info.value)


def test_good_lora_flags_pass_the_checks(smollm2_path, lora_adapters):
    _check(str(smollm2_path), "--enable-lora", "--lora-modules", f"sql={lora_adapters['sql']}",
           f'{{"name": "poet", "path": "{lora_adapters["poet"]}"}}')
    _check(str(smollm2_path), "--enable-lora", "--max-loras", "2", "--max-cpu-loras", "2")
    _check(str(smollm2_path), "--enable-lora", "--max-cpu-loras", "8")


@pytest.mark.parametrize("argv,needle", [
    (["--lora-modules", "a={sql}"], "--lora-modules needs --enable-lora"),
    (["--enable-lora", "--max-lora-rank", "1", "--lora-modules", "a={sql}"],
     "LoRA adapter 'a' ({sql}): rank 8 is above --max-lora-rank 1"),
    (["--enable-lora", "--max-loras", "2", "--max-cpu-loras", "1", "--lora-modules", "a={sql}"],
     "--max-cpu-loras must be at least --max-loras (2), got 1: the host cache holds every adapter of a batch; "
     "give --max-cpu-loras 2 or more, or leave it out (it defaults to --max-loras)"),
])
def test_bad_lora_flags_are_one_line_from_the_cli(smollm2_path, lora_adapters, argv, needle):
    fill = {name: str(path) for name, path in lora_adapters.items()}
    proc = run_main("serve", str(smollm2_path), *[a.format(**fill) for a in argv])
    assert_one_line(proc, "brigade serve", needle.format(**fill))
    assert "tensors from" not in proc.stderr


def test_lora_requests_info_metric(server):
    """vLLM's ``lora_requests_info`` under the brigade: prefix: the latest running/waiting adapters as labels."""
    from brigade.interfaces import IterationStats, SchedulerStats
    from brigade.metrics.prometheus import PrometheusStatLogger

    logger = PrometheusStatLogger("m", max_loras=2)
    logger.record(SchedulerStats(running_lora_adapters={"sql": 2, "poet": 1}, waiting_lora_adapters={"x": 1}),
                  IterationStats())
    logger.record(SchedulerStats(running_lora_adapters={"sql": 1}), IterationStats())
    text = logger.render()[0].decode()
    lines = [line for line in text.splitlines() if line.startswith("brigade:lora_requests_info{")]
    assert len(lines) == 1 and 'max_lora="2"' in lines[0] and 'running_lora_adapters="sql"' in lines[0] \
        and 'waiting_lora_adapters=""' in lines[0] and 'engine="0"' in lines[0]
    assert "brigade:lora_requests_info" not in PrometheusStatLogger("m").render()[0].decode()
    import httpx

    body = httpx.get(server.url("/metrics"), timeout=30).text
    assert any(line.startswith("brigade:lora_requests_info{") and 'max_lora="2"' in line for line in body.splitlines())
