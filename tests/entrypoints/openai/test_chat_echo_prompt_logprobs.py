"""Chat fields vLLM serves beyond OpenAI's: ``echo`` prepends the continued assistant message, and
``prompt_logprobs`` come back as completions return them (refused with a stream or out of range)."""

from __future__ import annotations

from shared_server import CONTINUED, MODEL, QUESTION, assert_400, chat_body, tokenize


def test_chat_echo_prepends_the_continued_assistant_message(client):
    kwargs = dict(model=MODEL, messages=CONTINUED, max_tokens=3, temperature=0,
                  extra_body={"continue_final_message": True, "add_generation_prompt": False})
    plain = client.chat.completions.create(**kwargs).choices[0].message.content
    kwargs["extra_body"]["echo"] = True
    echoed = client.chat.completions.create(**kwargs).choices[0].message.content
    assert echoed == "Once upon a" + plain
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(**kwargs, stream=True)
                       if c.choices)
    assert streamed == echoed


def test_chat_echo_after_a_user_message_adds_nothing(client):
    kwargs = dict(model=MODEL, messages=QUESTION, max_tokens=3, temperature=0)
    plain = client.chat.completions.create(**kwargs).choices[0].message.content
    assert client.chat.completions.create(**kwargs, extra_body={"echo": True}).choices[0].message.content == plain


def test_chat_prompt_logprobs_are_returned_as_completions_return_them(http):
    out = http.post("/v1/chat/completions", json=chat_body(prompt_logprobs=2))
    assert out.status_code == 200, out.text
    body = out.json()
    ids = tokenize(http, messages=QUESTION)
    prompt_logprobs = body["prompt_logprobs"]
    assert len(prompt_logprobs) == len(ids) == body["usage"]["prompt_tokens"] and prompt_logprobs[0] is None
    same = http.post("/v1/completions", json={"model": MODEL, "prompt": ids, "max_tokens": 1, "temperature": 0,
                                              "prompt_logprobs": 2}).json()["choices"][0]["prompt_logprobs"]
    for token_id, entry, expected in zip(ids[1:], prompt_logprobs[1:], same[1:]):
        assert str(token_id) in entry and 2 <= len(entry) <= 3
        assert abs(entry[str(token_id)]["logprob"] - expected[str(token_id)]["logprob"]) < 1e-4
        assert entry[str(token_id)]["decoded_token"] == expected[str(token_id)]["decoded_token"]
    assert http.post("/v1/chat/completions", json=chat_body()).json().get("prompt_logprobs") is None


def test_chat_prompt_logprobs_with_stream_or_out_of_range_is_a_400(http):
    error = assert_400(http.post("/v1/chat/completions", json=chat_body(prompt_logprobs=1, stream=True)),
                       "prompt_logprobs")
    assert "stream" in error["message"], error
    assert_400(http.post("/v1/chat/completions", json=chat_body(prompt_logprobs=21)), "prompt_logprobs")
