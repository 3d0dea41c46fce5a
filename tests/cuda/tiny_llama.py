"""The small random-weight Llama of the engine-level GPU tests (no CUDA needed to import)."""

from __future__ import annotations


def tiny_llama_config(initializer_range: float = 0.1):
    """The small random-weight Llama of the engine-level GPU tests (4 layers, hidden 256, GQA 4/2 heads, vocab 512,
    no EOS), built by transformers; ``initializer_range`` sets how strongly attention mixes the context."""
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=512, max_position_embeddings=1024,
                       initializer_range=initializer_range, rms_norm_eps=1e-5, rope_theta=10000.0, eos_token_id=None,
                       bos_token_id=None, tie_word_embeddings=False)
