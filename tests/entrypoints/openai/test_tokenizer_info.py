"""GET /tokenizer_info behind ``--enable-tokenizer-info-endpoint`` (vLLM's), on a real ``brigade serve`` of SmolLM2:
the tokenizer's config with its class and chat template, and the requests lm-eval 0.4.13's ``local-completions``
model with its remote tokenizer (``tokenizer_backend=remote``; ``lm_eval.utils.RemoteTokenizer``) sent a Brigade
server, replayed as they were recorded on the wire (bodies and headers) on the first question of the local tasks in
examples/lm_eval_tasks/: the info, ``/tokenize`` of each prompt, the ``generate_until`` completion on the token ids it
got back, and the ``loglikelihood`` and ``loglikelihood_rolling`` completions (``echo`` with ``logprobs=1``, the
rolling one after the BOS id lm-eval tokenizes from the info) that lm-eval scores; each answer is
checked against transformers in fp32 and scored as lm-eval scores it. lm-eval itself is not a test dependency:
examples/lm_eval_remote_tokenizer.sh runs the real client (docs/server.md has its output). lm-eval sends the API key
on each request; the tokenizer routes stay open without it, as in vLLM."""

from __future__ import annotations

import httpx
import pytest
from jinja2 import BaseLoader, Environment, StrictUndefined
from remote_server import RemoteServer
from transformers import AutoTokenizer

API_KEY = "eval-key"
SERVED_NAME = "SmolLM2-135M-Instruct"
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]

# What lm-eval sent, in order, for the first question of capitals_gen then capitals_mc (examples/lm_eval_tasks/).
GEN_PROMPT = "The capital of France is"
GEN_IDS = [504, 3575, 282, 4649, 314]  # /tokenize's answer, sent back as the prompt
GEN_BODY = {"prompt": [GEN_IDS], "model": SERVED_NAME, "max_tokens": 8, "temperature": 0, "stop": [".", "<|im_end|>"],
            "seed": 1234}
MC_CONTEXT = "Question: What is the capital of France?\nAnswer:"
MC_CONTEXT_IDS = [17872, 42, 1812, 314, 260, 3575, 282, 4649, 47, 198, 21350, 42]
MC_CHOICES = {" Paris": [7042], " Berlin": [11452], " Madrid": [28030], " Rome": [7268]}  # continuation ids
ROLLING_TEXT = "The capital of France is Paris."  # capitals_ppl, scored after the BOS token
ROLLING_IDS = [504, 3575, 282, 4649, 314, 7042, 30]


@pytest.fixture(scope="module")
def info_server(smollm2_path):
    srv = RemoteServer(smollm2_path, ["--max-model-len", "256", "--enable-tokenizer-info-endpoint",
                                      "--served-model-name", SERVED_NAME], api_key=API_KEY)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def remote(info_server):
    """An HTTP session as lm-eval's RemoteTokenizer opens it: JSON content type and the Bearer key on every call."""
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {API_KEY}"}
    with httpx.Client(base_url=info_server.base_url, headers=headers, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def hf_tokenizer(smollm2_path):
    return AutoTokenizer.from_pretrained(smollm2_path)


def test_tokenizer_info_is_the_tokenizer_config_with_its_class_and_template(remote, hf_tokenizer):
    response = remote.get("/tokenizer_info")
    assert response.status_code == 200, response.text
    info = response.json()
    assert info["tokenizer_class"] == type(hf_tokenizer).__name__
    assert (info["eos_token"], info["bos_token"], info["pad_token"]) == ("<|im_end|>", "<|im_start|>", "<|im_end|>")
    assert info["model_max_length"] == hf_tokenizer.model_max_length
    assert info["chat_template"] == hf_tokenizer.chat_template
    assert info["added_tokens_decoder"]["2"] == "<|im_end|>"
    assert not any(key.endswith("_file") for key in info), sorted(info)  # no file paths of the server


def lm_eval_tokenize(remote, text) -> list[int]:
    """``RemoteTokenizer.encode``: the prompt without special tokens."""
    response = remote.post("/tokenize", json={"prompt": text, "add_special_tokens": False})
    assert response.status_code == 200, response.text
    return response.json()["tokens"]


def lm_eval_score(choice: dict, ctxlen: int) -> tuple[float, bool]:
    """``LocalCompletionsAPI.parse_logprobs``: the continuation's summed logprob and whether each of its tokens was
    the top one, from an echoed prompt (``[ctxlen:-1]`` drops the context and the one generated token)."""
    token_logprobs = choice["logprobs"]["token_logprobs"][ctxlen:-1]
    top_logprobs = choice["logprobs"]["top_logprobs"][ctxlen:-1]
    return sum(token_logprobs), all(lp == max(top.values()) for lp, top in zip(token_logprobs, top_logprobs))


def test_lm_eval_generate_until_requests(remote, hf_tokenizer, hf_reference):
    assert remote.get("/tokenizer_info").status_code == 200  # RemoteTokenizer._validate_server
    assert lm_eval_tokenize(remote, GEN_PROMPT) == GEN_IDS
    assert hf_tokenizer(GEN_PROMPT, add_special_tokens=False)["input_ids"] == GEN_IDS
    assert remote.get("/tokenizer_info").json()["eos_token"] == GEN_BODY["stop"][-1]  # the stop list's EOS text
    response = remote.post("/v1/completions", json=GEN_BODY)
    assert response.status_code == 200, response.text
    (choice,) = response.json()["choices"]
    expected = hf_tokenizer.decode(hf_reference.greedy([GEN_IDS], GEN_BODY["max_tokens"])[0])
    assert choice["text"] == expected.split(".")[0] == " Paris"


def test_lm_eval_loglikelihood_requests(remote, hf_reference):
    assert lm_eval_tokenize(remote, MC_CONTEXT) == MC_CONTEXT_IDS
    scores = {}
    for text, continuation in MC_CHOICES.items():
        whole = lm_eval_tokenize(remote, MC_CONTEXT + text)  # lm-eval encodes context + continuation, then splits
        assert whole == MC_CONTEXT_IDS + continuation
        body = {"model": SERVED_NAME, "prompt": [whole], "temperature": 0, "max_tokens": 1, "logprobs": 1,
                "seed": 1234, "echo": True}
        response = remote.post("/v1/completions", json=body)
        assert response.status_code == 200, response.text
        (choice,) = response.json()["choices"]
        assert len(choice["logprobs"]["token_logprobs"]) == len(whole) + 1
        scores[text], is_greedy = lm_eval_score(choice, len(MC_CONTEXT_IDS))
        reference = hf_reference.prompt_logprobs(whole)[len(MC_CONTEXT_IDS):]
        assert scores[text] == pytest.approx(sum(reference), abs=1e-3)
        assert not is_greedy  # no choice is the model's own greedy next token after "Answer:"
    assert max(scores, key=scores.get) == " Paris"  # the question counts as right in capitals_mc's acc


def test_lm_eval_loglikelihood_rolling_requests(remote, hf_reference):
    assert lm_eval_tokenize(remote, ROLLING_TEXT) == ROLLING_IDS
    bos = remote.get("/tokenizer_info").json()["bos_token"]
    assert lm_eval_tokenize(remote, bos) == [1]  # RemoteTokenizer.bos_token_id: lm-eval's prefix token
    body = {"model": SERVED_NAME, "prompt": [[1, *ROLLING_IDS]], "temperature": 0, "max_tokens": 1, "logprobs": 1,
            "seed": 1234, "echo": True}
    response = remote.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    (choice,) = response.json()["choices"]
    score, _ = lm_eval_score(choice, 1)
    assert score == pytest.approx(sum(hf_reference.prompt_logprobs([1, *ROLLING_IDS])[1:]), abs=1e-3)


def test_lm_eval_chat_template_request_is_refused_as_vllm_refuses_it(remote):
    """With ``--apply_chat_template``, lm-eval 0.4.13 sends the message list itself as ``prompt`` (its
    ``TemplateAPI.apply_chat_template`` returns the history unrendered for the remote backend); vLLM's
    ``/tokenize`` wants a string there, and so does Brigade's: a 400 naming the field."""
    response = remote.post("/tokenize", json={"prompt": [{"role": "user", "content": GEN_PROMPT}],
                                              "add_special_tokens": False})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "prompt", response.text


def test_remote_tokenizer_decode_eos_and_chat_template(remote, hf_tokenizer):
    """RemoteTokenizer's other methods: ``bos_token_id`` (the info's token text, tokenized: the prefix token of
    ``loglikelihood_rolling``, the third local task) and ``eos_token_id``; ``decode`` (``/detokenize``) and
    ``apply_chat_template`` (lm-eval's jinja2 environment over the served template, whose text must tokenize to the
    ids the server's own rendering gives), which lm-eval 0.4.13's local-completions does not call."""
    info = remote.get("/tokenizer_info").json()
    text = "The quick brown fox jumps over the lazy dog."
    ids = lm_eval_tokenize(remote, text)
    response = remote.post("/detokenize", json={"tokens": ids})
    assert response.status_code == 200, response.text
    assert response.json()["prompt"] == text
    assert lm_eval_tokenize(remote, info["eos_token"])[0] == hf_tokenizer.eos_token_id
    assert lm_eval_tokenize(remote, info["bos_token"])[0] == hf_tokenizer.bos_token_id
    env = Environment(loader=BaseLoader(), undefined=StrictUndefined, keep_trailing_newline=True)
    rendered = env.from_string(info["chat_template"]).render(messages=MESSAGES, add_generation_prompt=True)
    served = remote.post("/tokenize", json={"messages": MESSAGES, "add_generation_prompt": True})
    assert served.status_code == 200, served.text
    assert lm_eval_tokenize(remote, rendered) == served.json()["tokens"]


def test_the_tokenizer_routes_stay_open_without_the_key(info_server):
    assert httpx.get(info_server.url("/tokenizer_info")).status_code == 200
    assert httpx.post(info_server.url("/v1/completions"), json={"prompt": "Hi"}).status_code == 401


def test_no_tokenizer_info_without_the_flag(server):
    """The folder's shared server runs without the flag: the route does not exist."""
    response = httpx.get(server.url("/tokenizer_info"))
    assert response.status_code == 404 and "error" in response.json()
