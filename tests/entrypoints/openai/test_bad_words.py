"""``bad_words``: thousands of words are tokenized off the event loop (the server answers meanwhile), and their
token-id sequences keep first-seen order without repeats, with and without a leading space."""

from __future__ import annotations

import httpx
from shared_server import MODEL


def test_thousands_of_bad_words_are_tokenized_off_the_event_loop(client, server):
    # 4096 words (the most accepted), tokenized on the tokenizer thread in linear time; /health answers meanwhile
    # (they used to be tokenized on the event loop with a quadratic duplicate check: 16k words held every
    # request for 8 s, 200k froze the server).
    import threading

    words = [f"zq{i}x" for i in range(4096)]
    done = {}

    def ask():
        done["out"] = client.completions.create(model=MODEL, prompt="Hello", max_tokens=2,
                                                extra_body={"bad_words": words})

    worker = threading.Thread(target=ask)
    worker.start()
    health = httpx.get(server.url("/health"), timeout=5)
    worker.join(timeout=120)
    assert health.status_code == 200
    assert done["out"].choices[0].finish_reason in ("length", "stop")


def test_bad_words_token_ids_keep_first_seen_order_without_repeats(smollm2_path):
    from brigade.config import ModelConfig
    from brigade.engine.input_processor import bad_words_token_ids
    from brigade.tokenizer import get_tokenizer

    tokenizer = get_tokenizer(ModelConfig(model=str(smollm2_path)))
    ids = bad_words_token_ids(tokenizer, ["Paris", "Paris", " Paris", "London"])
    want = []
    for word in ("Paris", " Paris", "London", " London"):
        seq = tokenizer.encode(word, add_special_tokens=False)
        if seq not in want:
            want.append(seq)
    assert ids == want
