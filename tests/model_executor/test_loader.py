"""Loader tests: architecture lookup, dummy weights, and the errors a mismatched checkpoint must raise."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from brigade.attention.reference import ReferenceAttentionBackend
from brigade.config import ConfigError, ModelConfig
from brigade.model_executor.loader import get_hf_config, get_model_class, load_model
from brigade.model_executor.models.llama import LlamaForCausalLM

TINY = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, architectures=["LlamaForCausalLM"])
CPU = torch.device("cpu")


def _load(path, hf_config, **model_config):
    return load_model(ModelConfig(model=str(path), **model_config), hf_config, dtype=torch.float32, device=CPU,
                      attn_backend=ReferenceAttentionBackend)


def _logits(model, paged_steps_for, hf_config):
    steps = paged_steps_for(hf_config)
    steps.add_request("a", [3, 8])
    input_ids, positions, ctx = steps.step([("a", [1, 5, 9, 2, 7])])
    with torch.inference_mode():
        return model.compute_logits(model(input_ids, positions, ctx))


def test_dummy_weights_are_seeded_finite_and_need_only_the_config(tmp_path, paged_steps_for):
    hf_config = transformers.LlamaConfig(**TINY, tie_word_embeddings=False)
    hf_config.save_pretrained(str(tmp_path))  # config.json only: no weights on disk
    hf_config = get_hf_config(str(tmp_path))
    a = _load(tmp_path, hf_config, load_format="dummy", seed=7)
    b = _load(tmp_path, hf_config, load_format="dummy", seed=7)
    c = _load(tmp_path, hf_config, load_format="dummy", seed=8)
    assert torch.equal(a.model.layers[1].mlp.down_proj.weight, b.model.layers[1].mlp.down_proj.weight)
    assert not torch.equal(a.model.layers[1].mlp.down_proj.weight, c.model.layers[1].mlp.down_proj.weight)
    assert torch.equal(a.model.norm.weight, torch.ones(32))
    assert a.model.embed_tokens.weight.std().item() == pytest.approx(0.02, rel=0.1)
    logits = _logits(a, paged_steps_for, hf_config)
    assert logits.shape == (5, 96) and torch.isfinite(logits).all()
    assert torch.equal(logits, _logits(b, paged_steps_for, hf_config))
    with pytest.raises(FileNotFoundError, match="no \\*.safetensors"):
        _load(tmp_path, hf_config)


@pytest.fixture
def tiny_checkpoint(tmp_path, save_random_hf_model):
    path = save_random_hf_model(tmp_path / "ckpt", transformers.LlamaConfig(**TINY, tie_word_embeddings=True))
    return path, get_hf_config(str(path))


def _rewrite_weights(path, edit):
    tensors = load_file(str(path / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})


def test_missing_shard_is_an_error(tiny_checkpoint):
    path, hf_config = tiny_checkpoint
    _rewrite_weights(path, lambda t: t.pop("model.layers.1.self_attn.k_proj.weight"))
    with pytest.raises(ValueError, match=r"lacks 1 weight.*layers\.1\.self_attn\.qkv_proj\.weight \(shard 'k'\)"):
        _load(path, hf_config)


def test_unexpected_tensor_is_an_error(tiny_checkpoint):
    path, hf_config = tiny_checkpoint
    _rewrite_weights(path, lambda t: t.update({"model.layers.0.self_attn.q_norm.weight": torch.ones(8)}))
    with pytest.raises(ValueError, match="q_norm.weight' matches no parameter"):
        _load(path, hf_config)


def test_tied_checkpoint_with_lm_head_and_rope_tables_loads(tiny_checkpoint):
    path, hf_config = tiny_checkpoint

    def add_extras(t):
        t["lm_head.weight"] = t["model.embed_tokens.weight"].clone() * 0  # ignored: the head is tied
        t["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(4)

    _rewrite_weights(path, add_extras)
    model = _load(path, hf_config)
    assert torch.equal(model.lm_head.weight, load_file(str(path / "model.safetensors"))["model.embed_tokens.weight"])


def test_untied_checkpoint_without_lm_head_is_an_error(tiny_checkpoint):
    path, _ = tiny_checkpoint
    cfg = json.loads((path / "config.json").read_text())
    cfg["tie_word_embeddings"] = False
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="lm_head.weight"):
        _load(path, get_hf_config(str(path)))


def test_architecture_lookup_goes_through_the_registry(tmp_path):
    for arch in ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"):
        assert get_model_class(transformers.LlamaConfig(architectures=[arch])) is LlamaForCausalLM
    with pytest.raises(ConfigError, match="GPT2LMHeadModel is not supported; installed: .*LlamaForCausalLM"):
        get_model_class(transformers.GPT2Config(architectures=["GPT2LMHeadModel"]))
    with pytest.raises(ConfigError, match="not a directory with a config.json"):
        get_hf_config(str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match="gguf is not supported"):
        transformers.LlamaConfig(**TINY).save_pretrained(str(tmp_path))
        _load(tmp_path, get_hf_config(str(tmp_path)), load_format="gguf")
