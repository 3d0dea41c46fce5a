"""brigade-awq: serve AWQ checkpoints (AutoAWQ "GEMM" format, 4-bit) with ``--quantization awq``."""
