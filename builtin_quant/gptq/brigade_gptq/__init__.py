"""brigade-gptq: serve GPTQ checkpoints (AutoGPTQ / GPTQModel format, 4- and 8-bit) with ``--quantization gptq``."""
