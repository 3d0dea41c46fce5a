"""Write a tiny synthetic byte-level tokenizer into a dummy-weight model directory.

No real Llama 3 tokenizer can be fetched here, and the dummy-weight benchmarks send token-id prompts,
so the tokenizer only has to load and decode: 256 byte tokens (ids 0..255, GPT-2 byte-to-unicode
alphabet, no merges) plus <|begin_of_text|> 256, <|end_of_text|> 257 and <|eot_id|> 258 (EOS).
Ids at or above 259 decode to nothing; the benchmarks use ignore_eos, so the EOS id never matters.

    python benchmarks/configs/synthetic_tokenizer.py benchmarks/configs/llama-3.1-8b
"""

from __future__ import annotations

import json
import os
import sys

SPECIAL_TOKENS = ("<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>")


def write_tokenizer(model_dir: str, model_max_length: int) -> None:
    """Write tokenizer.json and tokenizer_config.json into ``model_dir``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_to_char = bytes_to_unicode()
    tokenizer = Tokenizer(models.BPE(vocab={byte_to_char[b]: b for b in range(256)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer.save(os.path.join(model_dir, "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": SPECIAL_TOKENS[0],
              "eos_token": SPECIAL_TOKENS[2], "model_max_length": model_max_length,
              "clean_up_tokenization_spaces": False}
    with open(os.path.join(model_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    target = sys.argv[1]
    with open(os.path.join(target, "config.json"), encoding="utf-8") as f:
        max_len = json.load(f)["max_position_embeddings"]
    write_tokenizer(target, max_len)
