"""Runtime LoRA loading, as vLLM serves it: ``brigade serve --enable-lora`` with
BRIGADE_ALLOW_RUNTIME_LORA_UPDATING=1 on loopback, the official openai client for the OpenAI routes and httpx for
POST /v1/load_lora_adapter and /v1/unload_lora_adapter. A loaded adapter is listed and gives the offline engine's
greedy text; an unloaded one is a 404 while a stream already running on it finishes with the same tokens; every
bad load is a 400 in OpenAI's shape naming the problem; a name unloaded and loaded again is a new adapter (no
prefix-cache blocks of the old one are reused). One server for the module."""

from __future__ import annotations

import logging
import re
import shutil
import threading
import time

import httpx
import openai
import pytest
import torch
from lora_utils import MAX_NEW_TOKENS, PROMPTS
from lora_utils import KEY, edit_config, edit_tensors, write_adapter
from remote_server import RemoteServer
from test_lora_server import _OFFLINE, _offline_text

from brigade import SamplingParams
from brigade.config import BrigadeConfig, LoRAConfig, ModelConfig
from brigade.entrypoints.openai.api_server import RUNTIME_LORA_ENV, runtime_lora_updating
from brigade.lora import LoRARequest

# Over two KV blocks of 16 tokens, so a second request on the same adapter hits the prefix cache.
LONG_PROMPT = ("In the old harbour town the fishermen rose before dawn, mended their nets by lantern light, and "
               "argued about the weather, the price of cod and the mayor's new tax on boats; then")
STREAM_TOKENS = 32


@pytest.fixture(scope="module")
def server(smollm2_path, lora_adapters):
    srv = RemoteServer(smollm2_path, ["--dtype", "float32", "--max-model-len", "256", "--kv-cache-memory", "0.1",
                                      "--served-model-name", "smol", "--enable-lora", "--max-loras", "2",
                                      "--max-lora-rank", "8", "--lora-modules", f"sql={lora_adapters['sql']}",
                                      "--disable-log-requests"],
                       env={RUNTIME_LORA_ENV: "1"})
    yield srv
    srv.stop()


def load(server, name, path) -> httpx.Response:
    return httpx.post(server.url("/v1/load_lora_adapter"), json={"lora_name": name, "lora_path": str(path)},
                      timeout=60)


def unload(server, name, **extra) -> httpx.Response:
    return httpx.post(server.url("/v1/unload_lora_adapter"), json={"lora_name": name, **extra}, timeout=60)


def model_ids(server) -> list[str]:
    return [m.id for m in server.openai_client().models.list().data]


def offline(smollm2_path, lora_adapters, name: str | None, prompt: str, max_tokens: int = MAX_NEW_TOKENS):
    """The offline engine's greedy output on ``lora_adapters[name]`` (None: the base model); the engine is the
    one test_lora_server.py builds, shared."""
    if "llm" not in _OFFLINE:
        _offline_text(smollm2_path, lora_adapters, None)
    request = None if name is None else LoRARequest(name, 1 + list(lora_adapters).index(name),
                                                    str(lora_adapters[name]))
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    return _OFFLINE["llm"].generate(prompt, params, use_tqdm=False, lora_request=request)[0].outputs[0]


def complete(server, model: str, prompt: str, max_tokens: int = MAX_NEW_TOKENS):
    return server.openai_client().completions.create(model=model, prompt=prompt, max_tokens=max_tokens,
                                                     temperature=0, extra_body={"ignore_eos": True})


def assert_error(response: httpx.Response, status: int, param: str | None, *needles: str) -> dict:
    """OpenAI's error shape with ``status``, ``param``, and a one-line message holding every needle."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    error = body["error"]
    assert error["param"] == param and error["type"] and error["code"] is not None, error
    for needle in needles:
        assert needle in error["message"], error["message"]
    assert "\n" not in error["message"]
    return error


def test_load_list_run_unload(server, smollm2_path, lora_adapters):
    """Load → listed as vLLM lists adapters → completions and chat run on it (the offline engine's text) →
    unload → gone from /v1/models, and a 404 model_not_found for requests naming it."""
    response = load(server, "poet", lora_adapters["poet"])
    assert response.status_code == 200 and response.text == "Success: LoRA adapter 'poet' added successfully."
    client = server.openai_client()
    cards = {m.id: m for m in client.models.list().data}
    assert list(cards) == ["smol", "sql", "poet"]
    assert cards["poet"].parent == "smol" and cards["poet"].root == str(lora_adapters["poet"])
    assert client.models.retrieve("poet").root == str(lora_adapters["poet"])
    resp = complete(server, "poet", PROMPTS[0])
    assert resp.model == "poet"
    assert resp.choices[0].text == offline(smollm2_path, lora_adapters, "poet", PROMPTS[0]).text
    assert resp.choices[0].text != offline(smollm2_path, lora_adapters, None, PROMPTS[0]).text
    chat = client.chat.completions.create(model="poet", messages=[{"role": "user", "content": "Hi"}], max_tokens=3,
                                          temperature=0)
    assert chat.model == "poet" and chat.choices[0].message.content

    response = unload(server, "poet")
    assert response.status_code == 200 and response.text == "Success: LoRA adapter 'poet' removed successfully."
    assert model_ids(server) == ["smol", "sql"]
    with pytest.raises(openai.NotFoundError) as info:
        complete(server, "poet", PROMPTS[0], max_tokens=2)
    assert info.value.body["code"] == "model_not_found" and "'poet' does not exist" in info.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="poet", messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("poet")


@pytest.mark.parametrize("breakage,needle", [
    (lambda p: (p / "adapter_config.json").unlink(), "no adapter_config.json in the folder"),
    (lambda p: (p / "adapter_config.json").write_text("{not json"), "cannot read adapter_config.json"),
    (lambda p: edit_config(p, r="eight"), "'r' must be a positive integer, got 'eight'"),
    (lambda p: edit_config(p, r=16), "rank 16 is above --max-lora-rank 8; raise --max-lora-rank to at least 16"),
    (lambda p: edit_tensors(p, lambda t: t[f"{KEY}.lora_A.weight"].__setitem__((0, 0), float("nan"))),
     f"tensor '{KEY}.lora_A.weight' holds NaN or infinite values"),
    (lambda p: edit_tensors(p, lambda t: t[f"{KEY}.lora_B.weight"].__setitem__((1, 1), float("inf"))),
     f"tensor '{KEY}.lora_B.weight' holds NaN or infinite values"),
    (lambda p: edit_tensors(p, lambda t: t.update({f"{KEY}.lora_A.weight": torch.zeros(8, 100)})),
     f"tensor '{KEY}.lora_A.weight' has shape [8, 100], expected [8, 576]"),
    (lambda p: edit_config(p, target_modules=5), "'target_modules' must be a list of module names or a string"),
    (lambda p: (p / "adapter_config.json").write_text('{"r": ' + "9" * 5001 + "}"), "cannot read adapter_config"),
], ids=["no-config", "config-not-json", "bad-rank-type", "rank-above-max", "nan", "inf", "wrong-shape",
        "targets-not-a-list", "huge-int"])
def test_a_bad_adapter_is_a_400_naming_the_problem(server, tmp_path, smollm2_config, breakage, needle):
    path = write_adapter(tmp_path / "bad", smollm2_config, seed=0, rank=8, targets=("q_proj", "v_proj"), layers=[0])
    breakage(path)
    error = assert_error(load(server, "bad", path), 400, "lora_path", f"LoRA adapter 'bad' ({path}): ", needle)
    assert error["type"] == "invalid_request_error"
    assert "bad" not in model_ids(server)


def test_bad_names_and_bodies_are_400s(server, tmp_path, lora_adapters):
    poet = str(lora_adapters["poet"])
    assert_error(load(server, "lost", tmp_path / "nowhere"), 400, "lora_path", "'lost'", "not a folder")
    assert_error(load(server, "sql", poet), 400, "lora_name", "LoRA adapter 'sql' is already loaded")
    assert_error(load(server, "smol", poet), 400, "lora_name", "'smol' has the served model's name")
    url = server.url("/v1/load_lora_adapter")
    for body, param, needle in [({"lora_name": "", "lora_path": poet}, "lora_name", "at least 1 character"),
                                ({"lora_name": "x", "lora_path": ""}, "lora_path", "at least 1 character"),
                                ({"lora_name": "x"}, "lora_path", "Field required"),
                                ({"lora_name": 7, "lora_path": poet}, "lora_name", "valid string"),
                                ({"lora_name": "x", "lora_path": poet, "load_inplace": True}, "load_inplace",
                                 "load_inplace is not supported")]:
        assert_error(httpx.post(url, json=body, timeout=30), 400, param, needle)
    assert_error(httpx.post(url, content=b"{", timeout=30), 400, None, "not valid JSON")
    for name in ("x" * 257, "a\x00b", "line\nbreak"):  # names are echoed in /v1/models, 404s and logs
        assert_error(httpx.post(url, json={"lora_name": name, "lora_path": poet}, timeout=30), 400, "lora_name", "")
    assert_error(httpx.post(server.url("/v1/unload_lora_adapter"), json={"lora_name": ""}, timeout=30), 400,
                 "lora_name", "at least 1 character")
    assert model_ids(server) == ["smol", "sql"]


def test_unloading_an_unknown_adapter_is_a_404(server):
    error = assert_error(unload(server, "nope"), 404, "lora_name", "LoRA adapter 'nope' is not loaded", "'sql'")
    assert error["type"] == "not_found_error"
    # vLLM's optional lora_int_id is accepted and not checked (the server assigns ids; vLLM unloads by name)
    assert_error(unload(server, "nope", lora_int_id=3), 404, "lora_name", "LoRA adapter 'nope' is not loaded")
    assert model_ids(server) == ["smol", "sql"]


def test_two_concurrent_loads_of_one_name_do_not_both_succeed(server, lora_adapters):
    barrier = threading.Barrier(2)
    results: list[httpx.Response] = []

    def go():
        barrier.wait()
        results.append(load(server, "twin", lora_adapters["poet"]))

    threads = [threading.Thread(target=go) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.status_code for r in results) == [200, 400], [r.text for r in results]
    refused = next(r for r in results if r.status_code == 400)
    assert_error(refused, 400, "lora_name", "LoRA adapter 'twin' is ")  # "being loaded" or "already loaded"
    assert model_ids(server).count("twin") == 1
    assert unload(server, "twin").status_code == 200


def test_a_stream_on_an_adapter_finishes_on_it_after_its_unload(server, smollm2_path, lora_adapters):
    """Unloading takes the adapter away from new requests at once; a request streaming on it keeps its weights
    to the end (same tokens as the offline engine), and the engine drops them after it."""
    assert load(server, "stream", lora_adapters["poet"]).status_code == 200
    client = server.openai_client()
    stream = client.completions.create(model="stream", prompt=PROMPTS[1], max_tokens=STREAM_TOKENS, temperature=0,
                                       stream=True, extra_body={"ignore_eos": True})
    texts, after_unload, unloaded = [], 0, False
    for chunk in stream:
        assert chunk.model == "stream"
        texts.append(chunk.choices[0].text)
        if unloaded:
            after_unload += 1
        elif chunk.choices[0].text:
            assert unload(server, "stream").status_code == 200
            unloaded = True
            assert "stream" not in model_ids(server)
            with pytest.raises(openai.NotFoundError):
                complete(server, "stream", PROMPTS[0], max_tokens=1)
    assert unloaded and after_unload >= 1, "the stream ended before the unload: the test tested nothing"
    expected = offline(smollm2_path, lora_adapters, "poet", PROMPTS[1], STREAM_TOKENS)
    assert "".join(texts) == expected.text
    deadline = time.monotonic() + 10  # the engine core logs when the weights go (after the stream's last step)
    while not re.search(r"LoRA adapter 'stream' \(id \d+\): weights dropped", server.log_tail(50000)):
        assert time.monotonic() < deadline, server.log_tail()
        time.sleep(0.2)


def test_a_lora_modules_adapter_unloaded_and_loaded_again_is_a_new_adapter(server, smollm2_path, lora_adapters):
    """``sql`` (from --lora-modules) may be unloaded, as in vLLM; loaded again under the same name from another
    folder it gets a new id: no prefix-cache block computed with the old weights is reused."""
    def cached_tokens(resp) -> int:
        return resp.usage.prompt_tokens_details.cached_tokens

    first = complete(server, "sql", LONG_PROMPT, max_tokens=4)
    assert first.choices[0].text == offline(smollm2_path, lora_adapters, "sql", LONG_PROMPT, 4).text
    assert cached_tokens(complete(server, "sql", LONG_PROMPT, max_tokens=4)) >= 16  # the prompt's blocks are cached
    assert unload(server, "sql").status_code == 200
    with pytest.raises(openai.NotFoundError):
        complete(server, "sql", LONG_PROMPT, max_tokens=1)
    assert load(server, "sql", lora_adapters["poet"]).status_code == 200
    assert server.openai_client().models.retrieve("sql").root == str(lora_adapters["poet"])
    again = complete(server, "sql", LONG_PROMPT, max_tokens=4)
    assert cached_tokens(again) == 0
    assert again.choices[0].text == offline(smollm2_path, lora_adapters, "poet", LONG_PROMPT, 4).text
    assert again.choices[0].text != first.choices[0].text
    assert cached_tokens(complete(server, "sql", LONG_PROMPT, max_tokens=4)) >= 16  # its own blocks are
    # Back to the module's starting state; the info gauge lists no adapter once nothing runs.
    assert unload(server, "sql").status_code == 200
    assert load(server, "sql", lora_adapters["sql"]).status_code == 200
    complete(server, "smol", PROMPTS[0], max_tokens=1)
    metrics = httpx.get(server.url("/metrics"), timeout=30).text
    info = [line for line in metrics.splitlines() if line.startswith("brigade:lora_requests_info{")]
    assert len(info) == 1 and 'running_lora_adapters=""' in info[0] and 'waiting_lora_adapters=""' in info[0]


def test_host_copies_are_capped_and_a_gone_folder_fails_only_its_requests(server, smollm2_path, lora_adapters,
                                                                          tmp_path):
    """--max-cpu-loras (here its default, --max-loras 2) caps the host copies, not the adapters served: after
    three loads all are listed and the first one's weights are only on disk. Its folder deleted, a request on
    it ends with finish_reason "abort" and the reason as stop_reason; the server lives on, the others run, and
    it can be unloaded."""
    log_start = len(server.log_tail(10**9))
    folders = {name: shutil.copytree(lora_adapters["poet"], tmp_path / name) for name in ("gone", "kept1", "kept2")}
    for name, folder in folders.items():
        assert load(server, name, folder).status_code == 200
    assert {"gone", "kept1", "kept2"} <= set(model_ids(server))
    shutil.rmtree(folders["gone"])
    response = httpx.post(server.url("/v1/completions"), json={"model": "gone", "prompt": PROMPTS[0], "max_tokens": 4,
                                                              "temperature": 0}, timeout=60)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert choice["finish_reason"] == "abort" and choice["text"] == ""
    assert choice["stop_reason"].startswith(f"LoRA adapter 'gone' ({folders['gone']}): not a folder; ")
    assert "--max-cpu-loras 2" in choice["stop_reason"] and "\n" not in choice["stop_reason"]
    for name in ("kept1", "kept2"):  # whichever of the two is no longer cached is read again
        assert complete(server, name, PROMPTS[0]).choices[0].text == \
            offline(smollm2_path, lora_adapters, "poet", PROMPTS[0]).text
    assert complete(server, "sql", PROMPTS[0]).choices[0].text == \
        offline(smollm2_path, lora_adapters, "sql", PROMPTS[0]).text
    for name in folders:
        assert unload(server, name).status_code == 200
    assert model_ids(server) == ["smol", "sql"]
    log = server.log_tail(10**9)[log_start:]
    assert "LoRA adapter 'gone' (id " in log and "Traceback" not in log


def test_engine_core_with_a_worker_process_and_overlapped_steps(smollm2_path, lora_adapters):
    """The mp executor (worker in its own process) with overlapped scheduling: an adapter removed and another
    added between steps, while a step's answer is still unread on the pipe. The request running on the removed
    adapter finishes with the tokens it has without the removal; the worker drops the weights after it; the
    name may then come back from another folder, as a new adapter."""
    from brigade import LLM
    from brigade.interfaces import EngineCoreOutput, EngineCoreRequest, FinishReason
    from brigade.sampling_params import RequestOutputKind

    llm = LLM(str(smollm2_path), dtype="float32", max_model_len=256, kv_cache_memory_gib=0.1, enable_lora=True,
              max_loras=1, max_lora_rank=8, distributed_executor_backend="mp", async_scheduling=True)
    engine, core = llm.engine, llm.engine.core
    try:
        poet = LoRARequest("poet", 1, str(lora_adapters["poet"]))
        params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, output_kind=RequestOutputKind.FINAL_ONLY)
        reference = llm.generate(PROMPTS[1], params, use_tqdm=False, lora_request=poet)[0].outputs[0].token_ids
        poet_id = engine.lora_requests["poet"].lora_int_id
        engine.add_request("a", PROMPTS[1], params, lora_request=poet)
        finished, steps = {}, 0
        while engine.has_unfinished_requests():
            finished.update((o.request_id, o) for o in engine.step() if o.finished)
            steps += 1
            if steps == 3:
                assert core._in_flight is not None  # a step launched, its answer not read yet
                assert engine.remove_lora("poet") and core.loras_to_remove == {poet_id}  # "a" still runs on it
                assert engine.add_lora(LoRARequest("sql", 1, str(lora_adapters["sql"])))
                assert poet_id in core.loras
                # A request on it arriving after the unload (no front end sends one) is aborted, not run.
                late = EngineCoreRequest("late", [1, 2, 3], params, None, time.time(), lora_name="poet",
                                         lora_int_id=poet_id)
                assert core.add_request(late) == EngineCoreOutput("late", [], finish_reason=FinishReason.ABORT)
        assert finished["a"].outputs[0].token_ids == reference
        assert not core.loras_to_remove and poet_id not in core.loras
        assert core.executor.remove_lora(poet_id) is False  # the worker no longer holds it
        poet_again = LoRARequest("poet", 1, str(lora_adapters["sql"]))  # the name again, another folder
        outputs = llm.generate([PROMPTS[0]] * 2, params, use_tqdm=False,
                               lora_request=[engine.lora_requests["sql"], poet_again])
        assert engine.lora_requests["poet"].lora_int_id not in (poet_id, engine.lora_requests["sql"].lora_int_id)
        expected = offline(smollm2_path, lora_adapters, "sql", PROMPTS[0], 16).token_ids
        assert [o.outputs[0].token_ids for o in outputs] == [expected, expected]
    finally:
        core.shutdown()


@pytest.mark.parametrize("value,lora,mounted,warning", [
    (None, True, False, None),
    ("0", True, False, None),
    ("False", True, False, None),
    ("1", True, True, "whoever may call this API"),
    ("TRUE", True, True, "whoever may call this API"),
    ("yes", True, True, "whoever may call this API"),
    ("true", False, False, "is set but the server runs without --enable-lora"),
    ("maybe", True, False, "is not a boolean"),
])
def test_the_switch(smollm2_path, caplog, value, lora, mounted, warning):
    """BRIGADE_ALLOW_RUNTIME_LORA_UPDATING: routes only when true and --enable-lora; set without --enable-lora
    (or set to a non-boolean) is one WARNING and the server starts without them."""
    config = BrigadeConfig(model_config=ModelConfig(model=str(smollm2_path)),
                           lora_config=LoRAConfig() if lora else None)
    with caplog.at_level(logging.WARNING, logger="brigade.server"):
        assert runtime_lora_updating(config, {} if value is None else {RUNTIME_LORA_ENV: value}) is mounted
    messages = [r.getMessage() for r in caplog.records if r.name == "brigade.server"]
    if warning is None:
        assert messages == []
    else:
        assert len(messages) == 1 and warning in messages[0] and RUNTIME_LORA_ENV in messages[0]
