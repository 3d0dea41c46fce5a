"""N-gram speculative decoding and structured output under tensor and pipeline parallelism (mp executor, real
gloo groups), on a tiny random Llama with SmolLM2's tokenizer: ``-tp 2`` and ``-pp 2`` with n-gram drafts give
transformers' greedy tokens, as ``-tp 1`` does, drafts being accepted and rejected; a regular expression grammar
(xgrammar) gives the same tokens under ``-tp 2`` and ``-pp 2`` as under ``-tp 1``, and text the grammar accepts.
Every rank samples the same token from the same all-gathered logits with the scheduler's drafts and bitmask,
broadcast with the step; a pipeline stage before the last learns the accepted drafts from the next schedule."""

from __future__ import annotations

import re
import shutil

import pytest
import torch
import transformers
from parallel_check import hf_greedy_tokens, run_check

SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


@pytest.fixture(scope="module")
def tokenized_llama(tmp_path_factory, smollm2_path):
    """hidden 64, 4 heads, 2 KV heads, 2 layers, SmolLM2's vocabulary and tokenizer files (tied embeddings); weights
    drawn with std 0.1, so that its greedy output repeats a token a few times then moves on: n-gram drafts are both
    accepted and rejected."""
    config = transformers.LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                      rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2,
                                      initializer_range=0.1, architectures=["LlamaForCausalLM"])
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tokenized-llama")
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(smollm2_path / name, path / name)
    return path


def test_ngram_speculation_tp2_and_pp2_match_transformers(tokenized_llama):
    refs = hf_greedy_tokens(tokenized_llama)
    got = run_check(tokenized_llama, "fork", "auto", "1x1,2x1,1x2", speculative_config=SPEC)
    for layout in ("1x1", "2x1", "1x2"):
        assert got[layout]["tokens"] == refs, layout
        assert got[layout]["again"] == refs[2:], layout
        spec = got[layout]["spec"]
        assert 0 < spec["num_accepted_tokens"] < spec["num_draft_tokens"], (layout, spec)  # both outcomes
    assert got["1x1"]["spec"] == got["2x1"]["spec"]
    assert got["1x2"]["spec"]["num_accepted_tokens"] > 0


def test_regex_grammar_tp2_and_pp2_match_tp1(tokenized_llama):
    pattern = r"[a-z]{2,6}-[0-9]{3}( [a-z]+)*"
    got = run_check(tokenized_llama, "fork", "auto", "1x1,2x1,1x2",
                    request={"structured_outputs": {"regex": pattern}}, skip_tokenizer_init=False)
    assert got["2x1"]["tokens"] == got["1x1"]["tokens"] == got["1x2"]["tokens"]
    print("TEXTS", got["2x1"]["texts"], got["2x1"]["tokens"])
    for text in got["2x1"]["texts"]:
        assert re.fullmatch(pattern, text) or re.fullmatch(r"[a-z]{2,6}-[0-9]{0,3}|[a-z]{0,6}", text), text
    assert any(re.fullmatch(pattern, t) for t in got["2x1"]["texts"]), got["2x1"]["texts"]
