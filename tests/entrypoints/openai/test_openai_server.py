"""End to end: a real ``brigade serve`` on SmolLM2, driven with the official ``openai`` client and raw HTTP.

One server for the whole module (start-up dominates). Outputs are greedy and short, since the CPU is slow.
"""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from remote_server import RemoteServer
from transformers import AutoTokenizer

from brigade.version import __version__

MODEL_NAME = "smollm2"
API_KEY = "test-key"
MAX_MODEL_LEN = 512
PROMPT = "The capital of France is"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def stats_jsonl(tmp_path_factory):
    return tmp_path_factory.mktemp("stats") / "steps.jsonl"


@pytest.fixture(scope="module")
def server(smollm2_path, stats_jsonl):
    srv = RemoteServer(smollm2_path, ["--served-model-name", MODEL_NAME, "--max-model-len", str(MAX_MODEL_LEN),
                                      "--num-gpu-blocks-override", "128", "--max-num-seqs", "8",
                                      "--block-size", "16", "--enable-log-requests"],  # the abort test reads it
                       api_key=API_KEY, env={"BRIGADE_ENDPOINT_PLUGINS": "reset_prefix_cache",
                                                         "BRIGADE_STATS_JSONL": str(stats_jsonl)})
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def client(server):
    return server.openai_client()


@pytest.fixture(scope="module")
def tokenizer(smollm2_path):
    return AutoTokenizer.from_pretrained(str(smollm2_path))


def metrics(server) -> dict[str, float]:
    """GET /metrics as {series with labels: value} (model_name label dropped for brevity; the per-engine series
    summed over their ``engine`` label, which is "0" alone here)."""
    text = httpx.get(server.url("/metrics"), timeout=30).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            name = re.sub(r'engine="\d+",?', "", name.replace(f'model_name="{MODEL_NAME}"', ""))
            name = name.replace("{,", "{").replace(",}", "}").replace("{}", "")
            out[name] = out.get(name, 0.0) + float(value)
    return out


def sse_events(response: httpx.Response) -> list[str]:
    return [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]


# ---- routes outside /v1 --------------------------------------------------------------------------

def test_health_version_models(server, client):
    health = httpx.get(server.url("/health"))
    assert health.status_code == 200 and health.content == b""
    assert httpx.get(server.url("/version")).json() == {"version": __version__}
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL_NAME]
    assert models.data[0].max_model_len == MAX_MODEL_LEN
    one = client.models.retrieve(MODEL_NAME)
    assert one.id == MODEL_NAME and one.max_model_len == MAX_MODEL_LEN
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("no-such-model")
    assert info.value.body["code"] == "model_not_found" and info.value.body["param"] == "model"


def test_tokenize_detokenize_round_trip(server, tokenizer):
    text = "Hello world, this is Brigade."
    tokens = httpx.post(server.url("/tokenize"), json={"prompt": text}).json()
    assert tokens["tokens"] == tokenizer(text)["input_ids"]
    assert tokens["count"] == len(tokens["tokens"]) and tokens["max_model_len"] == MAX_MODEL_LEN
    back = httpx.post(server.url("/detokenize"), json={"tokens": tokens["tokens"]}).json()
    assert back == {"prompt": text}
    chat = httpx.post(server.url("/tokenize"), json={"messages": QUESTION}).json()
    rendered = tokenizer.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True)
    assert chat["tokens"] == tokenizer(rendered, add_special_tokens=False)["input_ids"]


# ---- completions ---------------------------------------------------------------------------------

def test_completion_greedy_and_usage(client, tokenizer):
    out = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=6, temperature=0, logprobs=2)
    choice = out.choices[0]
    assert out.object == "text_completion" and out.model == MODEL_NAME
    assert choice.text.startswith(" Paris."), choice.text  # transformers' greedy text: " Paris.\n\nThe answer is: ..."
    assert choice.finish_reason == "length"
    assert out.usage.prompt_tokens == len(tokenizer(PROMPT)["input_ids"])
    assert out.usage.completion_tokens == 6 == len(choice.logprobs.tokens)
    assert out.usage.total_tokens == out.usage.prompt_tokens + 6
    assert "".join(choice.logprobs.tokens) == choice.text
    assert choice.logprobs.text_offset[0] == 0 and all(lp <= 0 for lp in choice.logprobs.token_logprobs)
    for chosen, top in zip(choice.logprobs.tokens, choice.logprobs.top_logprobs):
        assert chosen in top and 1 <= len(top) <= 3  # the greedy choice is the best candidate
        assert top[chosen] == max(top.values())


def test_completion_stream_matches_and_usage(client):
    full = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=5, temperature=0)
    chunks = list(client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=5, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    *content, last = chunks
    assert all(c.object == "text_completion" and c.usage is None for c in content)
    assert "".join(c.choices[0].text for c in content) == full.choices[0].text
    assert content[-1].choices[0].finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in content[:-1])
    assert last.choices == [] and last.usage.completion_tokens == 5
    assert last.usage.prompt_tokens == full.usage.prompt_tokens
    # Only full blocks are cached: a 5-token prompt fills none.
    assert last.usage.prompt_tokens_details.cached_tokens == 0


@pytest.mark.parametrize("route", ["completions", "chat"])
def test_continuous_usage_stats_count_tokens_chunk_by_chunk(client, route):
    """vLLM's stream_options.continuous_usage_stats: every content chunk carries the usage so far."""
    options = {"include_usage": True, "continuous_usage_stats": True}
    if route == "completions":
        stream = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=5, temperature=0,
                                           stream=True, stream_options=options)
    else:
        stream = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": PROMPT}],
                                                max_tokens=5, temperature=0, stream=True, stream_options=options)
    chunks = list(stream)
    *content, last = chunks
    counts = [c.usage.completion_tokens for c in content if c.usage is not None]
    assert counts and counts == sorted(counts) and counts[-1] == 5  # grows to the final count
    assert all(c.usage.prompt_tokens == last.usage.prompt_tokens for c in content if c.usage is not None)
    assert all(c.usage.total_tokens == c.usage.prompt_tokens + c.usage.completion_tokens
               for c in content if c.usage is not None)
    assert last.choices == [] and last.usage.completion_tokens == 5


def test_batched_prompts_token_ids_and_n(client, tokenizer):
    out = client.completions.create(model=MODEL_NAME, prompt=[PROMPT, PROMPT], n=2, max_tokens=2, temperature=0)
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    texts = {c.text for c in out.choices}
    assert len(texts) == 1 and next(iter(texts)).startswith(" Paris")
    assert all(c.finish_reason == "length" for c in out.choices)
    ids = tokenizer(PROMPT)["input_ids"]
    assert out.usage.prompt_tokens == 2 * len(ids) and out.usage.completion_tokens == 4 * 2
    by_ids = client.completions.create(model=MODEL_NAME, prompt=ids, max_tokens=2, temperature=0)
    assert {by_ids.choices[0].text} == texts  # a token-id prompt gives what its text gives
    nested = client.completions.create(model=MODEL_NAME, prompt=[ids, ids[:2]], max_tokens=1, temperature=0)
    assert len(nested.choices) == 2 and texts.pop().startswith(nested.choices[0].text)


def test_stream_n2_each_choice_finishes(client):
    chunks = list(client.completions.create(model=MODEL_NAME, prompt=PROMPT, n=2, max_tokens=3, temperature=0,
                                            stream=True))
    texts, reasons = {0: "", 1: ""}, {}
    for c in chunks:
        for choice in c.choices:
            texts[choice.index] += choice.text
            if choice.finish_reason:
                reasons[choice.index] = choice.finish_reason
    assert reasons == {0: "length", 1: "length"} and texts[0] == texts[1] and texts[0].startswith(" Paris")


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_never_in_output(client, stream):
    kwargs = dict(model=MODEL_NAME, prompt=PROMPT, max_tokens=8, temperature=0, stop=["."])
    if stream:
        chunks = list(client.completions.create(stream=True, **kwargs))
        text = "".join(c.choices[0].text for c in chunks)
        reason = chunks[-1].choices[0].finish_reason
    else:
        out = client.completions.create(**kwargs)
        text, reason = out.choices[0].text, out.choices[0].finish_reason
    assert text == " Paris" and "." not in text and reason == "stop"


def test_echo_and_include_stop_str(client):
    out = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=4, temperature=0, echo=True,
                                    stop="Paris", extra_body={"include_stop_str_in_output": True})
    assert out.choices[0].text == PROMPT + " Paris" and out.choices[0].finish_reason == "stop"


def test_echo_with_logprobs_scores_the_prompt(server, client, tokenizer):
    ids = tokenizer(PROMPT)["input_ids"]
    out = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=2, temperature=0, echo=True,
                                    logprobs=1)
    choice = out.choices[0]
    lp = choice.logprobs
    assert choice.text.startswith(PROMPT) and len(lp.tokens) == len(ids) + 2
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None  # the first token has no context
    assert all(x < 0 for x in lp.token_logprobs[1:]) and all(1 <= len(t) <= 2 for t in lp.top_logprobs[1:])
    assert lp.text_offset[len(ids)] == len(PROMPT)  # generated tokens start after the echoed prompt
    chunks = list(client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=2, temperature=0, echo=True,
                                            logprobs=1, stream=True))
    streamed = [t for c in chunks for t in c.choices[0].logprobs.token_logprobs]
    assert streamed == lp.token_logprobs and "".join(c.choices[0].text for c in chunks) == choice.text
    # vLLM's prompt_logprobs extra: one entry per prompt token, with the same values as the echo.
    body = {"model": MODEL_NAME, "prompt": ids, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 2}
    raw = httpx.post(server.url("/v1/completions"), json=body, headers=server.headers(), timeout=60).json()
    prompt_logprobs = raw["choices"][0]["prompt_logprobs"]
    assert len(prompt_logprobs) == len(ids) and prompt_logprobs[0] is None
    for token_id, entry, echoed in zip(ids[1:], prompt_logprobs[1:], lp.token_logprobs[1:]):
        assert abs(entry[str(token_id)]["logprob"] - echoed) < 1e-4 and 2 <= len(entry) <= 3


def test_sampling_extras_are_honoured(client, tokenizer):
    paris, period = tokenizer(" Paris")["input_ids"][0], tokenizer(".")["input_ids"][0]

    def text(kwargs: dict) -> tuple[str, str]:
        kwargs = dict(kwargs)
        extra = kwargs.pop("extra_body", {})
        out = client.completions.create(model=MODEL_NAME, prompt=kwargs.pop("prompt", PROMPT),
                                        **{"temperature": 0, "max_tokens": 2, **kwargs}, extra_body=extra)
        return out.choices[0].text, out.choices[0].finish_reason

    seeded = dict(temperature=1.0, seed=1234, max_tokens=4, extra_body={"repetition_penalty": 1.2})
    requests = [
        dict(prompt="Hello", logit_bias={str(paris): 100}),
        dict(extra_body={"allowed_token_ids": [period]}),
        dict(extra_body={"stop_token_ids": [period], "top_k": 5, "min_p": 0.01}, max_tokens=4),
        dict(extra_body={"bad_words": ["Paris"]}),
        seeded, seeded,
        dict(user="u-1", presence_penalty=0.5, frequency_penalty=0.5,
             extra_body={"priority": 0, "cache_salt": "tenant-a", "min_tokens": 2, "ignore_eos": True,
                         "skip_special_tokens": False}),
    ]
    # Sent together, so the engine batches them (and the server serves them concurrently).
    with ThreadPoolExecutor(len(requests)) as pool:
        biased, allowed, stopped, no_paris, seeded_a, seeded_b, extras = pool.map(text, requests)
    assert biased == (" Paris Paris", "length")
    assert allowed == ("..", "length")
    assert stopped == (" Paris", "stop")
    assert " Paris" not in no_paris[0]
    assert seeded_a == seeded_b
    assert extras[1] == "length"


# ---- chat ----------------------------------------------------------------------------------------

def test_chat_greedy_and_usage(server, client):
    out = client.chat.completions.create(model=MODEL_NAME, messages=QUESTION, max_completion_tokens=12,
                                         temperature=0, logprobs=True, top_logprobs=2)
    choice = out.choices[0]
    assert out.object == "chat.completion" and choice.message.role == "assistant"
    assert choice.message.content == "The capital of France is Paris."  # transformers' greedy answer
    assert choice.finish_reason == "stop"
    num_prompt = httpx.post(server.url("/tokenize"), json={"messages": QUESTION}).json()["count"]
    assert out.usage.prompt_tokens == num_prompt
    assert out.usage.completion_tokens == len(choice.logprobs.content)  # the text plus the EOS token
    assert all(len(t.top_logprobs) == 2 and t.top_logprobs[0].token == t.token for t in choice.logprobs.content)


def test_chat_stream_shape_and_cached_tokens(client):
    full = client.chat.completions.create(model=MODEL_NAME, messages=QUESTION, max_tokens=4, temperature=0)
    chunks = list(client.chat.completions.create(model=MODEL_NAME, messages=QUESTION, max_tokens=4, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    first, *content, last = chunks
    assert first.object == "chat.completion.chunk" and first.choices[0].delta.role == "assistant"
    assert all(c.usage is None for c in [first, *content])
    assert "".join(c.choices[0].delta.content or "" for c in content) == full.choices[0].message.content
    assert content[-1].choices[0].finish_reason == "length"
    assert last.choices == [] and last.usage.completion_tokens == 4
    # The same 37-token prompt ran just before: its two full 16-token blocks hit the prefix cache.
    assert last.usage.prompt_tokens_details.cached_tokens == 32


# ---- errors --------------------------------------------------------------------------------------

BAD_REQUESTS = [
    ("/v1/chat/completions", {"model": MODEL_NAME}, 400, "messages"),
    ("/v1/completions", {"prompt": PROMPT, "temperature": -1}, 400, "temperature"),
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/chat/completions", {"messages": QUESTION, "max_completion_tokens": 0}, 400, "max_completion_tokens"),
    ("/v1/completions", {"prompt": PROMPT, "n": 0}, 400, "n"),
    ("/v1/completions", {"prompt": PROMPT, "stop": 3}, 400, "stop"),
    ("/v1/completions", {"prompt": PROMPT, "logprobs": 100}, 400, "logprobs"),
    ("/v1/chat/completions", {"messages": QUESTION, "logprobs": True, "top_logprobs": 100}, 400, "top_logprobs"),
    ("/v1/completions", {"prompt": ""}, 400, "prompt"),
    ("/v1/completions", {"prompt": []}, 400, "prompt"),
    ("/v1/completions", {"prompt": [10**6]}, 400, "prompt"),
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": MAX_MODEL_LEN}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi " * MAX_MODEL_LEN}, 400, "prompt"),
    ("/v1/completions", {"prompt": PROMPT, "suffix": "!"}, 400, "suffix"),
    # Integers beyond 64 bits are refused by name (one overflowed the engine's message encoder: a 500).
    ("/v1/completions", {"prompt": PROMPT, "priority": 2**80}, 400, "priority"),
    ("/v1/completions", {"prompt": PROMPT, "seed": -2**70}, 400, "seed"),
    ("/v1/completions", {"prompt": PROMPT, "logit_bias": {str(2**70): 1}}, 400, "logit_bias"),
    ("/v1/chat/completions", {"messages": QUESTION, "stop_token_ids": [2**64]}, 400, "stop_token_ids"),
    # Constraints xgrammar rejects are refused before queuing (tests/entrypoints/openai/test_structured_outputs.py
    # covers the valid ones).
    ("/v1/chat/completions", {"messages": QUESTION, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}}, 400, "response_format"),
    ("/v1/chat/completions", {"messages": QUESTION, "tools": [{"type": "function", "function": {"name": "f g"}}]},
     400, "tools"),
    ("/v1/completions", {"prompt": PROMPT, "structured_outputs": {"regex": "a+("}}, 400, "structured_outputs"),
    ("/v1/completions", {"prompt": PROMPT, "model": "not-this-one"}, 404, "model"),
]


@pytest.mark.parametrize("path,body,status,param", BAD_REQUESTS, ids=[f"{b[3]}-{i}" for i, b in enumerate(BAD_REQUESTS)])
def test_bad_request_is_openai_shaped(server, path, body, status, param):
    response = httpx.post(server.url(path), json={"max_tokens": 2, **body}, headers=server.headers(), timeout=60)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param
    if status == 400:
        assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize("body", [b"{not json", b"", b"[1, 2]"])
def test_malformed_body_is_400_never_422(server, body):
    response = httpx.post(server.url("/v1/completions"), content=body, timeout=30,
                          headers={**server.headers(), "Content-Type": "application/json"})
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_a_prompt_too_long_for_the_default_max_tokens_says_it_is_the_default(server):
    response = httpx.post(server.url("/v1/completions"), json={"prompt": [42] * (MAX_MODEL_LEN - 5)},
                          headers=server.headers(), timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "max_tokens"
    assert f"({MAX_MODEL_LEN - 5} in the prompt, 16 in the output, the default max_tokens)" in error["message"]


def test_openai_client_sees_errors_then_server_still_works(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=2, temperature=-1)
    assert info.value.param == "temperature"
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt=PROMPT, max_tokens=2)
    out = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=2, temperature=0)
    assert out.choices[0].text.startswith(" Paris")


def test_api_key_required_on_v1_only(server):
    with pytest.raises(openai.AuthenticationError):
        server.openai_client(api_key="wrong").models.list()
    missing = httpx.get(server.url("/v1/models"))
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(server.url("/health")).status_code == 200  # outside /v1: no key needed


def test_bearer_scheme_is_case_insensitive_and_the_key_exact(server):
    def status(header: str) -> int:
        return httpx.get(server.url("/v1/models"), headers={"Authorization": header}).status_code

    assert [status(f"{scheme} {API_KEY}") for scheme in ("Bearer", "bearer", "BEARER")] == [200, 200, 200]
    assert status(f"Basic {API_KEY}") == 401
    assert status(f"Bearer {API_KEY[:-1]}") == 401 and status(f"Bearer {API_KEY}x") == 401
    assert status("Bearer") == 401 and status(API_KEY) == 401


def test_the_key_is_compared_as_two_digests_of_one_length(monkeypatch):
    """Both sides are hashed before the constant-time comparison, so neither the key's bytes nor its length show in
    the time a wrong key takes (comparing the raw values would stop at the first length mismatch)."""
    import hmac

    from brigade.entrypoints.openai.api_server import APIKeyMiddleware

    compared = []
    compare = hmac.compare_digest
    monkeypatch.setattr(hmac, "compare_digest", lambda a, b: compared.append((len(a), len(b))) or compare(a, b))
    middleware = APIKeyMiddleware(app=None, api_key=API_KEY)
    headers = [f"Bearer {API_KEY}", f"bearer {API_KEY}", "Bearer x", f"Bearer {API_KEY * 50}", "Bearer", API_KEY]
    assert [middleware._authorized(h.encode()) for h in headers] == [True, True, False, False, False, False]
    assert compared == [(32, 32)] * len(headers)


def test_kept_alive_connection_answers_as_fast_as_a_fresh_one(server):
    # Without TCP_NODELAY on accepted sockets, each response on a reused connection waits ~40 ms for a delayed ACK.
    def median_s(get) -> float:
        times = []
        for _ in range(9):
            start = time.perf_counter()
            assert get(server.url("/version")).status_code == 200
            times.append(time.perf_counter() - start)
        return sorted(times)[len(times) // 2]

    with httpx.Client() as pooled:
        pooled.get(server.url("/version"))  # open the connection
        reused = median_s(pooled.get)
    fresh = median_s(lambda url: httpx.get(url, headers={"Connection": "close"}))
    assert reused < fresh + 0.02, (reused, fresh)


def test_unknown_route_is_openai_shaped_404(server):
    response = httpx.get(server.url("/v1/nope"), headers=server.headers())
    assert response.status_code == 404 and response.json()["error"]["type"] == "not_found_error"


def test_endpoint_plugin_mounted_when_allowed(server):
    # BRIGADE_ENDPOINT_PLUGINS=reset_prefix_cache names the example endpoint plugin (plugins/).
    response = httpx.post(server.url("/admin/reset_prefix_cache"), headers=server.headers(), timeout=30)
    assert response.status_code == 200 and response.json() == {"reset": True}
    assert httpx.post(server.url("/admin/reset_prefix_cache"), timeout=30).status_code == 401


def test_plugin_stat_logger_sees_steps(client, stats_jsonl):
    # The example stat-logger plugin (plugins/jsonl_stat_logger) writes one line per engine step.
    client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=2, temperature=0)
    steps = [json.loads(line) for line in stats_jsonl.read_text().splitlines()]
    assert sum(step["iteration_stats"]["num_generation_tokens"] for step in steps) >= 2


# ---- metrics and disconnects ---------------------------------------------------------------------

def test_metrics_names_and_counters_move(server, client):
    before = metrics(server)
    for name in ("brigade:num_requests_running", "brigade:num_requests_waiting", "brigade:kv_cache_usage_perc",
                 "brigade:prefix_cache_queries_total", "brigade:prefix_cache_hits_total",
                 "brigade:prompt_tokens_total", "brigade:generation_tokens_total",
                 "brigade:num_preemptions_total", 'brigade:request_success_total{finished_reason="length"}',
                 "brigade:time_to_first_token_seconds_count", "brigade:inter_token_latency_seconds_count",
                 "brigade:e2e_request_latency_seconds_count", "brigade:request_time_per_output_token_seconds_count"):
        assert name in before, name
    out = client.completions.create(model=MODEL_NAME, prompt="Count: one, two,", max_tokens=3, temperature=0,
                                    extra_body={"ignore_eos": True})
    after = metrics(server)
    assert after["brigade:generation_tokens_total"] - before["brigade:generation_tokens_total"] == 3
    assert after["brigade:prompt_tokens_total"] - before["brigade:prompt_tokens_total"] == out.usage.prompt_tokens
    key = 'brigade:request_success_total{finished_reason="length"}'
    assert after[key] - before[key] == 1
    assert after["brigade:inter_token_latency_seconds_count"] - before["brigade:inter_token_latency_seconds_count"] == 2
    assert after["brigade:e2e_request_latency_seconds_count"] - before["brigade:e2e_request_latency_seconds_count"] == 1
    assert after["brigade:prefix_cache_queries_total"] > before["brigade:prefix_cache_queries_total"]


def _wait_blocks_back(server, baseline_free: float, timeout_s: float = 20.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout_s
    while True:
        m = metrics(server)
        if m["brigade:num_free_blocks"] == baseline_free and m["brigade:kv_cache_usage_perc"] == 0.0:
            return m
        assert time.monotonic() < deadline, f"KV blocks not returned: {m['brigade:num_free_blocks']} free"
        time.sleep(0.2)


def test_stream_disconnect_aborts_and_frees_kv_blocks(server):
    baseline = metrics(server)
    assert baseline["brigade:kv_cache_usage_perc"] == 0.0
    body = {"model": MODEL_NAME, "prompt": "Tell me a long story about a dragon. " * 12, "max_tokens": 300,
            "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server.url("/v1/completions"), json=body, headers=server.headers(),
                      timeout=120) as response:
        events = response.iter_lines()
        received = 0
        while received < 2:
            if next(events).startswith("data: "):
                received += 1
        busy = metrics(server)
        assert busy["brigade:kv_cache_usage_perc"] > 0.0  # the request holds blocks while it streams
    after = _wait_blocks_back(server, baseline["brigade:num_free_blocks"])
    time.sleep(1.0)  # had the request kept running, tokens would keep counting
    assert metrics(server)["brigade:generation_tokens_total"] == after["brigade:generation_tokens_total"]
    assert "aborted before it finished (client gone or error sent)" in server.log_tail(20000)  # and says so


def test_non_stream_disconnect_aborts_and_frees_kv_blocks(server):
    baseline = metrics(server)
    body = {"model": MODEL_NAME, "prompt": "Write a poem about the sea. " * 12, "max_tokens": 300,
            "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url("/v1/completions"), json=body, headers=server.headers(), timeout=3)
    after = _wait_blocks_back(server, baseline["brigade:num_free_blocks"])
    time.sleep(1.0)
    assert metrics(server)["brigade:generation_tokens_total"] == after["brigade:generation_tokens_total"]


def test_server_serves_after_everything(client):
    out = client.chat.completions.create(model=MODEL_NAME, messages=QUESTION, max_tokens=3, temperature=0)
    assert out.choices[0].message.content.startswith("The capital")
    assert json.loads(out.model_dump_json())["usage"]["completion_tokens"] == 3
