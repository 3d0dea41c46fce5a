"""The model's tokenizer as the engine loads it: the engine, not transformers, judges prompt lengths."""

from brigade.config import ModelConfig
from brigade.tokenizer import get_tokenizer


def test_a_prompt_beyond_the_model_length_encodes_without_the_transformers_alarm(smollm2_path, capfd):
    tokenizer = get_tokenizer(ModelConfig(model=str(smollm2_path)))
    capfd.readouterr()
    ids = tokenizer("hi " * 9000)["input_ids"]
    assert len(ids) == 9001  # every token kept: the server refuses it with a 400 naming --max-model-len
    assert "sequence length is longer" not in capfd.readouterr().err
